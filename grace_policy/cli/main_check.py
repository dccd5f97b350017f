"""``grace-policy check -- CMD [ARGS...]``: what the plugin would do for a step.

It calls the same :func:`grace_policy.decide.decide` as the plugin, so the
answer on a login node is the plugin's answer on the compute node, given the
same node facts and environment. The exit code is the action (0 allow,
1 warn, 2 reject), so a job script or CI job can branch on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .common import (
    EX_SOFTWARE,
    EXIT_FOR_ACTION,
    UsageError,
    add_node_options,
    build_node,
    err,
    job_env,
    node_json,
    note_unknown_partition,
    report_config_error,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..findings import Verdict
    from ..node import NodeProfile
    from ..policy import Policy
    from ..python.nodeinterp import Basis
    from ..registry.cache import Holding
    from ..registry.manifest import Resolved
    from ..registry.pull import Pulled
    from ..registry.step import RegistryStep


def configure_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    parser = sub.add_parser(
        name, help=help_text,
        usage="grace-policy check [--partition P | --arch A --page-size N --glibc V] "
              "[--root DIR] [--image IMAGE] [--config F] [--env-file F] [--cwd D] "
              "[--gpus N | --gres gpu:N] [--gpu-arch SM] [--cuda-driver V] [--json] "
              "(-- CMD [ARGS...] | --batch SCRIPT [-- ARGS...])",
        description="Say what the plugin would do if a job step ran CMD: find the program "
                    "the way slurmstepd does, follow #! lines, resolve its libraries like "
                    "the node's glibc, judge architecture and page layout, and clean leaked "
                    "conda/venv variables. Mode enforce unless the config says otherwise.",
        epilog="Exit codes: 0 allow, 1 warn, 2 reject, 64 usage error, 78 config error.",
    )
    add_node_options(parser)
    parser.add_argument("--cwd", metavar="D",
                        help="the job's working directory (default: the current one)")
    parser.add_argument("--image", metavar="IMAGE",
                        help="judge CMD inside a container image, read without mounting: an "
                             "enroot/pyxis .sqsh, an Apptainer .sif, an unpacked root or an "
                             "OCI bundle (its config.json's process.args when no CMD); or a "
                             "registry image as pyxis/enroot name it "
                             "(docker://[USER@][REGISTRY#]IMAGE[:TAG], REGISTRY#IMAGE:TAG): "
                             "its platforms and architecture verdict from the registry's "
                             "manifest and config, as `enroot import` run by you would read "
                             "them (your environment, enroot.conf, .credentials); and its "
                             "files too when your enroot cache already holds every layer of "
                             "that manifest (each checked, none fetched; an import's time "
                             "and $TMPDIR space)")
    parser.add_argument("--pull", action="store_true",
                        help="with a registry --image: also judge its files, the manifest "
                             "judged pulled by its digest by your own `enroot import` into "
                             "$TMPDIR (as large as the image; removed afterwards), like a "
                             "local .sqsh")
    gpus = parser.add_mutually_exclusive_group()
    gpus.add_argument("--gpus", metavar="N",
                      help="the step gets N GPUs on its node, as with srun/sbatch --gpus=N "
                           "([TYPE:]N): sets SLURM_GPUS_ON_NODE=N in the judged "
                           "environment, as slurmstepd will (0: a step without GPUs)")
    gpus.add_argument("--gres", metavar="gpu:N",
                      help="the same as --gpus N, written as srun/sbatch --gres=gpu:[TYPE:]N "
                           "(or none)")
    add_gpu_node_options(parser)
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--batch", metavar="SCRIPT",
                        help="judge SCRIPT as an sbatch job's batch step: the script and "
                             "every command its lines will run (read, never run); "
                             "words after '--' are the script's arguments")
    parser.add_argument("command", nargs="*", metavar="CMD",
                        help="the step's command line; put it after '--'")


def _command(args: argparse.Namespace, rest: list[str] | None,
             default: tuple[str, ...] = ()) -> list[str]:
    if args.batch is not None:
        if args.command:
            raise UsageError("--batch SCRIPT: put the script's arguments after '--'")
        if not os.path.isfile(args.batch):
            from ..messages import escape

            raise UsageError(f"--batch: not a file: {escape(args.batch)!r}")
        return [os.path.abspath(args.batch), *(rest or [])]
    if rest is not None and args.command:
        raise UsageError("put the whole command after '--' (found "
                         f"{len(args.command)} word(s) before it)")
    command = rest if rest is not None else list(args.command)
    if not command and default:
        return list(default)
    if not command:
        raise UsageError("no command given: grace-policy check [options] -- CMD [ARGS...]")
    return command


def _gpu_count(args: argparse.Namespace) -> int | None:
    """The GPUs ``--gpus``/``--gres`` give the step on its node, or None when
    neither was given. Forms as srun takes them: ``--gpus [TYPE:]N``,
    ``--gres gpu[:TYPE]:N``, ``--gres gpu`` (one), ``--gres none``."""
    from ..messages import escape

    if getattr(args, "gpus", None) is not None:
        option, text = "--gpus", args.gpus.strip()
    elif getattr(args, "gres", None) is not None:
        option, text = "--gres", args.gres.strip()
        if text.lower() == "none":
            return 0
        name, _, text = text.partition(":")
        if name != "gpu" or "," in text:
            raise UsageError(f"--gres: only one gpu gres is judged (gpu:N or gpu:TYPE:N), "
                             f"got {escape(args.gres)!r}")
        text = text or "1"
    else:
        return None
    count = text.rsplit(":", 1)[-1]
    if not (count.isascii() and count.isdigit()) or len(count) > 6:
        raise UsageError(f"{option}: not a GPU count ([TYPE:]N): "
                         f"{escape(getattr(args, option[2:]))!r}")
    return int(count)


def add_gpu_node_options(parser: argparse.ArgumentParser) -> None:
    """The node's GPUs, over the config's ``gpu_arch``/``cuda_driver`` (and
    NVML's answer where this machine has GPUs)."""
    parser.add_argument("--gpu-arch", metavar="SM",
                        help="the node's GPU architecture, e.g. sm_100 (GB200/B200) or 10.0: "
                             "the kernels of the step's files are judged for it (implies "
                             "--gpus 1 unless --gpus/--gres or the environment say otherwise)")
    parser.add_argument("--cuda-driver", metavar="V",
                        help="the CUDA version the node's driver supports, as nvidia-smi "
                             "prints it ('CUDA Version'), e.g. 13.0")


def apply_gpu_options(args: argparse.Namespace, node: NodeProfile) -> NodeProfile:
    """``node`` with ``--gpu-arch``/``--cuda-driver`` on top; UsageError
    names the option and the form it wants."""
    from ..messages import escape
    from ..node import parse_cuda_version, parse_gpu_arch

    gpu_arch = cuda_driver = None
    try:
        if getattr(args, "gpu_arch", None) is not None:
            gpu_arch = parse_gpu_arch(args.gpu_arch)
    except ValueError as exc:
        raise UsageError(f"--gpu-arch: {escape(str(exc))}") from None
    try:
        if getattr(args, "cuda_driver", None) is not None:
            cuda_driver = parse_cuda_version(args.cuda_driver)
    except ValueError as exc:
        raise UsageError(f"--cuda-driver: {escape(str(exc))}") from None
    if gpu_arch is None and cuda_driver is None:
        return node
    return node.with_overrides(gpu_arch=gpu_arch, cuda_driver=cuda_driver)


def apply_gpus(env: dict[str, str], count: int | None) -> dict[str, str]:
    """The judged environment with the step's GPU variables as slurmstepd
    sets them: ``SLURM_GPUS_ON_NODE=N`` for N GPUs; for none it removes the
    step GPU variables (it does so for ``--gres=none``, even values the user
    exported), so an ``--env-file`` copied from a GPU job cannot say GPUs."""
    if count is None:
        return env
    from ..python.gpus import STEP_GPU_VARIABLES

    out = {k: v for k, v in env.items() if k not in STEP_GPU_VARIABLES}
    if count > 0:
        out["SLURM_GPUS_ON_NODE"] = str(count)
    return out


def _cwd(args: argparse.Namespace) -> str:
    if args.cwd is None:
        return os.getcwd()
    if not os.path.isdir(args.cwd):
        from ..messages import escape

        raise UsageError(f"--cwd: not a directory: {escape(args.cwd)!r}")
    return os.path.abspath(args.cwd)


def _open_image(path: str):  # type: ignore[no-untyped-def]
    """The image ``--image`` names; raises UsageError when it cannot be read."""
    from ..budget import Budget, BudgetExceeded
    from ..image import ImageError
    from ..image.open import open_image
    from ..messages import escape

    try:
        # A person asking can wait; the image is still read under a bound.
        return open_image(path, budget=Budget(60_000, 100_000, 1 << 34))
    except (ImageError, BudgetExceeded) as exc:
        raise UsageError(f"--image: cannot read {escape(path)!r}: "
                         f"{escape(getattr(exc, 'reason', None) or str(exc))}") from None


def execute(args: argparse.Namespace, rest: list[str] | None) -> int:
    registry = _registry_step(args.image) if getattr(args, "image", None) else None
    if registry is not None:
        return _execute_registry(args, rest, registry)
    if getattr(args, "pull", False):
        raise UsageError("--pull: only with a registry --image (docker://... or REGISTRY#IMAGE)")
    image = _open_image(args.image) if getattr(args, "image", None) else None
    return _execute_local(args, rest, image)


def _pull(step: RegistryStep, found: Resolved | None, machine: str) -> Pulled:
    """The image's squashfs, as the user's own ``enroot import`` for the
    node's architecture writes it (:mod:`grace_policy.registry.pull`): the
    manifest the check judged, by its digest, when there is one."""
    from ..messages import escape
    from ..registry.pull import PullError, enroot_import, enroot_uri, pinned_uri

    uri = pinned_uri(step.reference, found.digest) if found is not None and found.digest \
        else enroot_uri(step.given)
    _progress("--pull: your own `enroot import` is fetching and unpacking the image; "
              "this takes as long as the job's pull would")
    try:
        return enroot_import(uri, machine, os.environ)
    except PullError as exc:
        raise UsageError(f"--pull {escape(step.reference.shown())}: {escape(str(exc))}"
                         ) from None


def _open_pulled(pulled: Pulled, step: RegistryStep):  # type: ignore[no-untyped-def]
    """The pulled squashfs as an image named by its reference: findings
    name what the user asked for, not a scratch file."""
    from .._record import replace

    try:
        return replace(_open_image(pulled.path), path=step.reference.shown())
    except BaseException:
        pulled.remove()
        raise


def _execute_local(args: argparse.Namespace, rest: list[str] | None,
                   image, registry: tuple[dict[str, object], list[str]] | None = None
                   ) -> int:  # type: ignore[no-untyped-def]
    """The verdict for CMD on the host or in a local image. ``registry``:
    (the ``registry`` object of ``--json``, the lines said before the
    verdict) when the image is a registry image's files (pulled or cached)."""
    from ..compiled import load_policy
    from ..decide import StepRequest, decide
    from ..policy import ConfigError

    command = _command(args, rest, image.args if image is not None else ())
    env = job_env(args)
    count = _gpu_count(args)
    if count is None and getattr(args, "gpu_arch", None) is not None:
        # Asking about a GPU architecture means a step with GPUs: one, unless
        # the environment already says how many (--gpus 0 says none).
        from ..python.gpus import step_gpus

        count = None if step_gpus(env) is not None else 1
    env = apply_gpus(env, count)
    if image is None:
        cwd = _cwd(args)
    else:
        # Paths inside the image: the bundle's process.cwd, else /.
        cwd = args.cwd if args.cwd is not None else (image.cwd or "/")
        if not cwd.startswith("/"):
            raise UsageError("--cwd: with --image, an absolute path inside the image")
        env = image.step_env(env)
    try:
        policy = load_policy(args.config)
    except ConfigError as exc:
        return report_config_error(exc)
    node = apply_gpu_options(args, build_node(args, policy))
    note_unknown_partition(args, policy)
    who = None
    if policy.exemptions:
        from ..exempt import Who

        who = Who.current()  # the asking user, as the plugin would see them in their job
    if args.batch is not None:
        from ..batch.judge import decide_batch

        env.setdefault("SLURM_SUBMIT_DIR", cwd)
        verdict = decide_batch(policy, StepRequest(partition=args.partition, argv=command, env=env,
                                                   cwd=cwd, node=node, who=who))
    else:
        verdict = decide(policy, StepRequest(partition=args.partition, argv=command, env=env,
                                             cwd=cwd, node=node, who=who, image=image))
    crashed = bool(verdict.error and verdict.error.startswith("internal error"))
    assumed = _node_interpreter(command, env, cwd, node)
    if args.json:
        out = verdict.to_json()
        out["node"] = node_json(node)
        out["command"] = command
        if assumed is not None:
            out["assumed_interpreter"] = {**assumed.to_json(), "text": assumed.text(node)}
        if registry is not None:
            out["registry"] = registry[0]
        print(json.dumps(out, indent=2))
    elif not crashed:
        for line in registry[1] if registry is not None else ():
            print(line)
        for line in _human(verdict, policy, node, command):
            print(line)
        if assumed is not None:
            from ..messages import PREFIX, escape

            print(f"{PREFIX}note: judged as {escape(assumed.text(node))}")
    if crashed:
        # decide() turned a crash into the site's on_error action, which is right
        # for slurmstepd; a person asking wants to know the check did not run.
        from ..messages import escape

        err(escape(str(verdict.error)))
        err(f"(the plugin would {verdict.action} this step: on_error={policy.on_error})")
        return EX_SOFTWARE
    return EXIT_FOR_ACTION.get(verdict.action, EX_SOFTWARE)


def _registry_step(text: str) -> RegistryStep | None:
    """A registry reference (not a file here): the step enroot's import
    would make of it, with this user's settings; None for a local image."""
    if os.path.exists(text) or text.startswith(("/", ".")):
        return None
    from ..registry.reference import parse

    ref = parse(text)
    if ref is None:
        return None
    from ..registry.settings import for_user
    from ..registry.step import RegistryStep

    return RegistryStep(ref, for_user(dict(os.environ)), text)


def _execute_registry(args: argparse.Namespace, rest: list[str] | None,
                      step: RegistryStep) -> int:
    """The login-node question for a registry image. The manifest and config
    first (what the plugin decides before the pull); then its files, when
    ``--pull`` asks for them or the user's enroot cache already holds every
    layer (:mod:`grace_policy.registry.cache`), judged as a local image;
    else the manifest answer, with one line on what would judge the files."""
    from ..compiled import load_policy
    from ..decide import StepRequest, decide
    from ..messages import PREFIX, escape
    from ..policy import ConfigError

    if args.batch is not None:
        raise UsageError("--batch with a registry --image: not supported yet")
    try:
        policy = load_policy(args.config)
    except ConfigError as exc:
        return report_config_error(exc)
    node = build_node(args, policy)
    command = _command(args, rest, ("(the image's entrypoint)",))
    note_unknown_partition(args, policy)
    who = None
    if policy.exemptions:
        from ..exempt import Who

        who = Who.current()
    verdict = decide(policy, StepRequest(partition=args.partition, argv=command,
                                         env=job_env(args), cwd="/", node=node, who=who,
                                         registry=step))
    found = step.seen.get("found")
    said = _manifest_lines(step, found)
    if getattr(args, "pull", False):
        pulled = _pull(step, found, node.machine)
        digest = found.digest if found is not None and found.digest else ""
        said.append(f"{PREFIX}judged the files of "
                    f"{'manifest ' + escape(digest) if digest else 'the tag'}, pulled by your "
                    "own `enroot import`")
        return _judge_files(args, rest, step, pulled,
                            ({**_registry_json(step, found), "contents": "pull"}, said))
    hint, held = "", None
    if found is not None and found.digest:
        pulled, hint, held = _from_cache(step, found, node.machine)
        if pulled is not None:
            said.append(f"{PREFIX}judged the files of manifest {escape(found.digest)} from "
                        f"your enroot cache ({escape(held.path)}, {held.layers} layer(s); "
                        "no layer fetched)")
            info = {**_registry_json(step, found), "contents": "cache",
                    "cache": held.to_json()}
            return _judge_files(args, rest, step, pulled, (info, said))
    if args.json:
        out = verdict.to_json()
        out["node"] = node_json(node)
        out["command"] = command
        if found is not None:
            out["registry"] = {**_registry_json(step, found), "contents": "manifest"}
            if held is not None:
                out["registry"]["cache"] = {**held.to_json(), "note": hint}
        print(json.dumps(out, indent=2))
        return EXIT_FOR_ACTION.get(verdict.action, EX_SOFTWARE)
    for line in said:
        print(line)
    for line in _human(verdict, policy, node, command):
        print(line)
    if hint:
        print(f"{PREFIX}note: {escape(hint)}")
    return EXIT_FOR_ACTION.get(verdict.action, EX_SOFTWARE)


def _judge_files(args: argparse.Namespace, rest: list[str] | None, step: RegistryStep,
                 pulled: Pulled, registry: tuple[dict[str, object], list[str]]) -> int:
    """The verdict on the squashfs enroot wrote (pulled or from the cache),
    as for a local image, said with what it is; the scratch is removed."""
    image = _open_pulled(pulled, step)
    try:
        return _execute_local(args, rest, image, registry)
    finally:
        pulled.remove()


def _registry_json(step: RegistryStep, found: Resolved | None) -> dict[str, object]:
    if found is None:
        return {"reference": step.reference.shown(), "digest": None}
    return {"reference": step.reference.shown(), "digest": found.digest or None,
            "list_digest": found.list_digest, "platforms": list(found.image_platforms()),
            "architecture": found.arch, "os": found.os, "env": list(found.env),
            "entrypoint": list(found.entrypoint), "cmd": list(found.cmd)}


def _manifest_lines(step: RegistryStep, found: Resolved | None) -> list[str]:
    from ..messages import PREFIX, escape

    if found is None:
        return []
    has = ", ".join(found.image_platforms()) or "no platform"
    lines = [f"{PREFIX}image {escape(step.reference.shown())}: platforms {escape(has)}"]
    if found.digest:
        lines.append(f"{PREFIX}for this node enroot imports manifest {escape(found.digest)} "
                     f"({escape(found.os or 'linux')}/{escape(found.arch or '?')}); entrypoint "
                     f"{escape(json.dumps(list(found.entrypoint)))}, cmd "
                     f"{escape(json.dumps(list(found.cmd)))}, env "
                     f"{escape(json.dumps(list(found.env)))}")
    return lines


def _progress(line: str) -> None:
    """A line while a long import runs, for a person at a terminal only
    (stderr; never in --json or a script's capture)."""
    if sys.stderr.isatty():
        from ..messages import PREFIX

        print(f"{PREFIX}{line}", file=sys.stderr, flush=True)


def _from_cache(step: RegistryStep, found: Resolved, machine: str
                ) -> tuple[Pulled | None, str, Holding]:
    """(the squashfs enroot wrote from the user's cache, or None; the note
    for the manifest answer when None; what the cache holds)."""
    from ..registry.cache import CacheError, import_cached, look

    held = look(found, step.settings.env)
    rerun = "--pull would judge the files"
    if held.unusable:
        return None, f"the image's files were not judged ({held.unusable}); {rerun}", held
    if not held.complete:
        what = f"{held.held} of its {held.layers} layer(s)"
        if held.layers and held.held == held.layers:
            what = "its layers but not its config"
        return None, (f"judged from the manifest and config only: your enroot cache "
                      f"({held.path}) holds {what} of manifest {found.digest}; {rerun}"), held
    _progress("judging the files from your enroot cache: `enroot import` is unpacking "
              f"{held.layers} cached layer(s); this takes as long as unpacking the image")
    try:
        return import_cached(found, machine, os.environ, held), "", held
    except CacheError as exc:
        return None, (f"judged from the manifest and config only: your enroot cache "
                      f"({held.path}) was not used for manifest {found.digest}: {exc}; "
                      f"{rerun}"), held


def _node_interpreter(command: list[str], env: dict[str, str], cwd: str,
                      node: NodeProfile) -> Basis | None:
    """The node's own interpreter the answer assumed, when the program is a
    distribution path's python judged for another architecture (the user
    should know the answer is not about this host's file); else None."""
    if node.root_is_native:
        return None
    from ..budget import Budget, BudgetExceeded
    from ..launch import build_path, follow
    from ..python.names import may_run_python
    from ..python.nodeinterp import basis, is_node_build

    budget = Budget(10_000, 10_000, 1 << 30)
    try:
        exe = build_path(command[0], env, cwd, budget)
        if exe is None:
            return None
        last = follow(exe, env, cwd, budget)[-1]
        if last.kind != "elf" or not may_run_python(last.path) or not is_node_build(
                last.path, node):
            return None
        found = basis(last.path, node, budget)
    except BudgetExceeded:
        return None
    return found if found.version is not None else None


def _human(verdict: Verdict, policy: Policy, node: NodeProfile, command: list[str]) -> list[str]:
    """The blocks the job would print, then one line with the outcome.

    Info findings are shown too (the plugin keeps them out of job output):
    someone running ``check`` by hand asked for the whole story.
    """
    from ..messages import PREFIX, escape, user_lines
    from ..rules import Catalogue

    lines = user_lines(verdict, catalogue=Catalogue.for_policy(policy),
                       contact=policy.contact, min_severity="info")
    where = f"partition {escape(verdict.partition)}, " if verdict.partition else ""
    facts = f"{where}{node.describe()}, mode {verdict.mode}"
    if verdict.image:
        facts += f", in image {escape(verdict.image)}"
    elif node.root not in ("", "/"):
        facts += f", image {escape(node.root)}"
    program = escape(command[0])
    if verdict.skipped:
        lines.append(f"{PREFIX}not checked: {escape(verdict.skipped)} ({facts})")
    elif verdict.action == "allow":
        lines.append(f"{PREFIX}allow: {program} would start ({facts})")
    elif verdict.action == "warn":
        lines.append(f"{PREFIX}warn: {program} would start, with the warnings above ({facts})")
    else:
        lines.append(f"{PREFIX}reject: the step would not start ({facts})")
    for ex in verdict.exempted:
        lines.append(f"{PREFIX}exempted: {escape(ex.rule)} for {escape(ex.path)} until "
                     f"{ex.until} ({ex.where}: {escape(ex.reason)})")
    if verdict.error:
        lines.append(f"{PREFIX}note: {escape(verdict.error)}")
    return lines
