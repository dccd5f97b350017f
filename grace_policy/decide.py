"""From a step to a verdict: the partition's mode, the checks, the catalogue.

The plugin and ``grace-policy check`` both call :func:`decide`, so what a
user is told on the login node is what the plugin will do on the compute
node. Every failure of the check itself becomes a verdict that follows the
admin's ``on_error``: this function does not raise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._record import dataclass, replace
from .budget import OUT_OF_MEMORY, Budget, BudgetExceeded
from .findings import ACTIONS, SEVERITY_RANK, EnvChanges, Finding, Verdict
from .fsprobe import HOST, Files
from .node import NodeProfile, detect
from .policy import Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .exempt import Exempted, Who
    from .image import Image
    from .registry.step import RegistryStep


@dataclass(frozen=True)
class StepRequest:
    """One step as its caller (the bridge, the node checker's child, the
    CLI) knows it: what to run, where, and the facts about the job that
    decide how it is judged. One record, so :func:`decide` and everything
    under it take it whole instead of a dozen loose parameters."""

    #: The step's partition (its mode, its node facts for the CLI).
    partition: str | None
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    #: The node judged against; None: this host with the policy's overrides.
    node: NodeProfile | None = None
    #: The mode the user lowered the step to (``--grace-policy=warn``).
    user_lowered_mode: str | None = None
    #: Why the step runs argv inside an image the check cannot see, as the
    #: caller established it from what Slurm says (see :func:`decide`).
    container: str | None = None
    #: The job's user and groups as Slurm set them, for exemptions.
    who: Who | None = None
    #: ``YYYY-MM-DD`` (UTC) to judge exemptions' expiry by; None: today.
    today: str | None = None
    #: The image the step runs in (an Image, or a path to open).
    image: Image | str | None = None
    #: The step's allowance when the caller already spent part of it.
    budget: Budget | None = None
    #: The caller ran out of the budget before the check could start.
    limit: str | None = None
    #: The step runs in a registry image pyxis will pull.
    registry: RegistryStep | None = None


def node_for(policy: Policy, partition: str | None, *, base: NodeProfile | None = None,
             use_partition: bool = False) -> NodeProfile:
    """The node a step is judged against.

    On the compute node the host is detected and ``[node]`` may override it
    (simulation, tests); a partition's facts describe its nodes for checks
    made elsewhere (the CLI on a login node), so they apply only then.
    """
    node = base or detect()
    overrides = policy.node_overrides_for(partition) if use_partition else policy.node
    return overrides.apply(node)


def action_for(mode: str, findings: Sequence[Finding]) -> str:
    if mode == "off" or not findings:
        return "allow"
    worst = min(SEVERITY_RANK[f.severity] for f in findings)
    if worst == SEVERITY_RANK["error"]:
        return "reject" if mode == "enforce" else "warn"
    if worst == SEVERITY_RANK["warning"]:
        return "warn"
    return "allow"


def error_verdict(policy: Policy, mode: str, partition: str | None, reason: str) -> Verdict:
    action = "reject" if policy.on_error == "deny" and mode != "off" else "allow"
    return Verdict(action=action, mode=mode, partition=partition, error=reason)


def step_budget(policy: Policy) -> Budget:
    """One step's allowance, from the policy's ``[limits]``: made once per
    step, before anything of it is read (its image included)."""
    return Budget(policy.limits.deadline_ms, policy.limits.max_files, policy.limits.max_bytes)


def decide(policy: Policy, step: StepRequest, *,
           probes: list[tuple[str, str, str]] | None = None) -> Verdict:
    """What the plugin does with ``step``. Never raises. Its fields:

    ``budget``: the step's allowance (:func:`step_budget`), when the caller
    already spent part of it reading the step's image; ``limit``: the
    caller ran out of it before the check could start (a ``check-limit``).

    ``image``: the step runs ``argv`` inside this container image (an
    :class:`~grace_policy.image.Image`, or a path to open: an unpacked root,
    a squashfs, a SIF or an OCI bundle); ``env`` and ``cwd`` are then the
    container's (:meth:`~grace_policy.image.Image.step_env`). Every file is
    read in the image. An image that cannot be read is skipped with its
    reason (what fails to import or start is the runtime's error to report).

    ``probes``: when given, filled with every filesystem question the check
    asked and its answer (:mod:`grace_policy.fsprobe`), for the verdict cache.

    ``container``: why the step runs argv inside an image (nothing on the
    host to judge), as the caller established it from what Slurm says. The
    step environment is never asked: ``SLURM_CONTAINER`` and plugin option
    variables can all be exported by the user (docs/SECURITY.md).

    ``who``: the job's user and groups as Slurm set them, for the policy's
    exemptions (none apply without it); ``today``: ``YYYY-MM-DD`` (UTC) to
    judge their expiry by, default the real date.

    ``registry``: the step runs in an image pyxis will pull from a registry;
    judged from its manifest and config (the architecture only), within the
    check's deadline; a registry that cannot be read follows ``on_error``.
    """
    mode = policy.mode
    partition = step.partition
    try:
        mode = policy.mode_for(partition, step.user_lowered_mode)
        if mode == "off":
            return Verdict(action="allow", mode=mode, partition=partition, skipped="mode off")
        if step.container:
            return Verdict(action="allow", mode=mode, partition=partition,
                           skipped=step.container)
        if step.limit is not None:
            return _limit_verdict(policy, mode, partition, step.limit)
        if step.registry is not None:
            return _registry(policy, mode, step, step.registry)
        if isinstance(step.image, str):
            from .image import ImageError
            from .image.open import open_image

            budget = step.budget or step_budget(policy)
            try:
                opened = open_image(step.image, budget=budget)
            except ImageError as exc:
                return Verdict(action="allow", mode=mode, partition=partition,
                               skipped=f"image not readable: {exc.reason}", image=step.image)
            step = replace(step, image=opened, budget=budget)
        if probes is None:
            verdict = _decide(policy, mode, step, HOST)
        else:
            files = Files.recorded()
            try:
                verdict = _decide(policy, mode, step, files)
            finally:
                probes.extend(files.records())
        if step.image is None and step.argv and _wraps_an_image(step.argv[0]) \
                and verdict.error is None and verdict.skipped is None \
                and not any(f.severity == "error" for f in verdict.findings):
            # `apptainer exec IMG CMD`: the host program can start; now CMD in
            # IMG. (Its warnings and notes, e.g. the host glibc's 4 KiB
            # layout on a simulated 64 KiB node, are kept beside the image's.)
            return _apptainer(policy, mode, step, verdict)
        return verdict
    except BudgetExceeded as exc:
        return _limit_verdict(policy, mode, partition, str(exc))
    except MemoryError:  # past max_memory (checker/confine.py): a cap, not a crash
        return _limit_verdict(policy, mode, partition, OUT_OF_MEMORY)
    except Exception as exc:  # never let a check failure escape into slurmstepd
        return error_verdict(policy, mode, partition,
                             f"internal error: {type(exc).__name__}: {exc}")


def _registry(policy: Policy, mode: str, request: StepRequest, step: RegistryStep) -> Verdict:
    """A registry image's verdict from its manifest, before any layer, under
    the step's budget (started before its plan read anything)."""
    from .registry import RegistryError

    partition = request.partition
    node = request.node or node_for(policy, partition)
    budget = request.budget or step_budget(policy)
    shown = step.reference.shown()
    try:
        issue, found = step.judge(node, budget)
    except (RegistryError, BudgetExceeded) as exc:
        return replace(_limit_verdict(policy, mode, partition,
                                      f"registry image {shown}: {exc}"), image=shown)
    if issue is None:
        return Verdict(action="allow", mode=mode, partition=partition,
                       skipped=step.judged(found), image=shown)
    from .rules import Catalogue

    findings = Catalogue.for_policy(policy).findings((issue,), finding_context(node, partition))
    exempted: tuple[Exempted, ...] = ()
    if policy.exemptions and findings:
        from . import exempt

        findings, exempted = exempt.apply(policy, findings, request.who, request.today)
    return Verdict(action=action_for(mode, findings), mode=mode, partition=partition,
                   findings=findings, exempted=exempted, image=shown)


def _wraps_an_image(argv0: str) -> bool:
    """A name test (every host step pays it): the contract's one rule, which
    the verdict cache's C and the bridge apply too."""
    from .contract import wraps_an_image

    return wraps_an_image(argv0)


def _apptainer(policy: Policy, mode: str, step: StepRequest, host: Verdict) -> Verdict:
    from .container.apptainer import plan_apptainer

    budget = step_budget(policy)  # the inner step's: from its image's first byte
    todo = plan_apptainer(step.argv, step.env, step.cwd, budget=budget)
    if todo is None:
        return host  # not an exec of a local image this parser is sure of
    if todo.image is None:
        return replace(host, skipped=todo.skipped)
    inner = _decide(policy, mode, replace(step, argv=list(todo.argv), env=todo.env,
                                          cwd=todo.cwd, image=todo.image, budget=budget), HOST)
    if not host.findings and not host.exempted:
        return inner
    findings = (*host.findings, *inner.findings)
    action = inner.action if inner.error else action_for(mode, findings)
    return replace(inner, findings=findings, action=action,
                   exempted=(*host.exempted, *inner.exempted))


def _decide(policy: Policy, mode: str, step: StepRequest, files: Files) -> Verdict:
    """The check of a step whose image, if any, is open (``step.image`` is
    an :class:`~grace_policy.image.Image` or None), reading the host's
    ``files`` (the image's view is taken from there)."""
    from .check import CheckInput, check

    partition = step.partition
    image = step.image if not isinstance(step.image, str) else None
    node = step.node or node_for(policy, partition)
    part = policy.partition(partition)
    report = check(CheckInput(step.argv, step.env, step.cwd, node,
                              budget=step.budget or step_budget(policy), image=image,
                              env_rules=policy.env, files=files,
                              cuda_index=part.cuda_index if part is not None else None))
    shown = image.path if image is not None else None
    if not report.issues and report.limit is None:
        return Verdict(action="allow", mode=mode, partition=partition, env=report.env,
                       image=shown)
    findings: tuple[Finding, ...] = ()
    if report.issues:
        from .rules import Catalogue

        catalogue = Catalogue.for_policy(policy)
        findings = catalogue.findings(report.issues, finding_context(node, partition))
    exempted: tuple[Exempted, ...] = ()
    if policy.exemptions and findings:
        from . import exempt

        findings, exempted = exempt.apply(policy, findings, step.who, step.today)
    found = Verdict(action=action_for(mode, findings), mode=mode, partition=partition,
                    findings=findings, env=report.env, exempted=exempted, image=shown)
    if report.limit is not None:
        return replace(_limit_verdict(policy, mode, partition, report.limit, found), image=shown)
    return found


def finding_context(node: NodeProfile, partition: str | None) -> dict[str, str]:
    """What rule texts may name about the node and the step's partition."""
    return {
        "partition": partition or "",
        "node_arch": node.machine,
        "page_size": str(node.page_size),
        "page_kib": str(node.page_size // 1024),
        "glibc": f"{node.glibc[0]}.{node.glibc[1]}" if node.glibc else "unknown",
    }


def _limit_verdict(policy: Policy, mode: str, partition: str | None, reason: str,
                   found: Verdict | None = None) -> Verdict:
    """The check stopped early: ``on_error`` decides what it could not see.

    What it saw before stopping (``found``: the verdict of its findings, its
    environment cleaning and exemptions) still counts, so a step
    that is already known to fail is not let through because something
    else in it was too big to finish; the stricter of the two wins. The
    environment cleaning decided before the stop is kept.
    """
    from .findings import Issue
    from .rules import Catalogue

    findings = found.findings if found is not None else ()
    verdict = error_verdict(policy, mode, partition, reason)
    action = max(verdict.action, found.action if found is not None else "allow",
                 key=ACTIONS.index)
    # The catalogue words it (a site's [rules.check-limit] text applies); the
    # severity follows what on_error did, so the user sees why.
    worded = Catalogue.for_policy(policy).finding(
        Issue("check-limit", "", "(none known: the check did not finish)",
              facts=(("limit", reason), ("path", "this step"))), {})
    remediation = (worded.remediation if worded is not None else "") + (
        f" (on_error={policy.on_error} decided the step)")
    limit = Finding(
        rule="check-limit",
        severity="error" if verdict.action == "reject" else "warning",
        path="",
        predicted_error="(none known: the check did not finish)",
        remediation=remediation.strip(),
    )
    ordered = tuple(sorted((limit, *findings), key=lambda f: SEVERITY_RANK[f.severity]))
    return Verdict(action=action, mode=mode, partition=partition, findings=ordered,
                   env=found.env if found is not None else EnvChanges(), error=reason,
                   exempted=found.exempted if found is not None else ())
