"""The plugin's C <-> Python contract, written down once.

Why one table: the step crosses from C to Python three ways (the cffi
struct of the embedded check, the frame slurmstepd sends the pre-started
helper and the node checker, and back as records), and each used to be
spelled out by hand on both sides, so a field added to one could be read
as another by the next. Everything here is the only source:

* spank/gen_contract.py writes ``build/grace_contract.h`` from it at build
  time (``make plugin``): ``struct grace_step``, the frame's field list as
  X-macros (grace_wire.c encodes and decodes the step by them), the
  ``GRACE_RC_*``, ``GRACE_EMIT_*``, ``GRACE_REC_*`` and ``GRACE_FAIL_*``
  constants; spank/build_plugin.py hands cffi the very same struct text;
* Python reads it at run time: :mod:`grace_policy.slurm_bridge` (the cffi
  struct, the codes it returns and emits) and :mod:`grace_policy.checker.wire`
  (the frames and records of the node checker) walk :data:`STEP` by name.

To add a field of the step: append a :class:`Field` to :data:`STEP` (the
struct, the frame and both Python readers follow), add it to
``slurm_bridge.StepInput`` (the build refuses a table and a StepInput that
differ: gen_contract.check_python_side), fill it in grace_stepd.c's
``grace_stepd_user_init``. To add a record kind: a line in :data:`RECORDS`,
then its writer and grace_wire.c's ``grace_decode`` case.
tests/test_contract.py round-trips every path through a C driver built from
these sources.

This module imports nothing: it is on every cold check's path.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

#: The kinds of value a field of the step holds. How C holds it, how the
#: frame carries it (u32 in host order; a text as its length with the NUL,
#: 0 for NULL, then its bytes and the NUL), what Python makes of it.
TEXT = "text"      # const char * or NULL; str | None (UTF-8, surrogateescape)
UINT = "uint"      # unsigned int; int
FLAG = "flag"      # int 0/1; bool
FD = "fd"          # int, -1 for none; int (the frame carries it as u32)
ARGV = "argv"      # char ** and its int count; frame: count, then the texts; tuple[str, ...]
ENV = "env"        # as ARGV, "NAME=VALUE" items; dict (first wins, items without '=' dropped)
OPAQUE = "opaque"  # void *: C's own, neither in the frame nor in Python

#: C declaration of each kind (the count of a list is its own ``int``).
C_TYPES = {TEXT: "const char *", UINT: "unsigned int", FLAG: "int", FD: "int",
           ARGV: "char **", ENV: "char **", OPAQUE: "void *"}
LISTS = (ARGV, ENV)


class Field:
    """One member of ``struct grace_step``. ``count``: the int member that
    holds a list's length; ``null``: what Python makes of a NULL text."""

    __slots__ = ("count", "doc", "kind", "name", "null")

    def __init__(self, name: str, kind: str, doc: str, *, count: str | None = None,
                 null: str | None = None) -> None:
        self.name, self.kind, self.doc, self.count, self.null = name, kind, doc, count, null

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {self.kind!r})"


#: ``struct grace_step`` in member order, which is also the frame's order
#: (less the OPAQUE member).
STEP = (
    Field("config", TEXT, "config=FILE from plugstack.conf, or NULL"),
    Field("on_error", TEXT, '"allow" | "deny" (C applies it; for the audit)', null="allow"),
    Field("partition", TEXT, "SLURM_JOB_PARTITION of the step, or NULL"),
    Field("cwd", TEXT, "the step's working directory, or NULL"),
    Field("user_mode", TEXT, "--grace-policy=MODE given by the user, or NULL"),
    Field("node", TEXT, "this node's name", null=""),
    Field("argv", ARGV, "S_JOB_ARGV", count="argc"),
    Field("env", ENV, 'S_JOB_ENV, "NAME=VALUE"', count="envc"),
    Field("job_id", UINT, "S_JOB_ID"),
    Field("step_id", UINT, "S_JOB_STEPID"),
    Field("uid", UINT, "S_JOB_UID"),
    Field("batch", FLAG, "1: the batch step (argv[0] is the stored script)"),
    Field("result", OPAQUE, "opaque, handed back to grace_emit()"),
    Field("container", TEXT, "why this is a container step (decided in C), or NULL"),
    Field("audit_path", TEXT, "audit=PATH from plugstack.conf, or NULL"),
    Field("audit_fd", FD, "that file, opened by root in slurm_spank_init, or -1"),
    Field("code", TEXT, 'which install runs the check: "<plugin dir>|<python_path>" (code())'),
    Field("container_kind", TEXT, 'the runtime that runs argv (grace_container.c): "pyxis" '
          "(image: a local .sqsh's absolute path, or pyxis' image string or container "
          'name) or "oci" (image: the config.json slurmstepd wrote), or NULL'),
    Field("container_image", TEXT, "see container_kind"),
    Field("container_local", FLAG, "1: container_image is a file on this node and is what "
          "runs (0 for pyxis --container-name: the named container's root decides)"),
    Field("container_args", TEXT, 'the runtime\'s own options, "key=value" lines (pyxis: '
          "mounts, workdir, mount_home; name, job, slurm_conf for --container-name), or NULL"),
    Field("max_memory", UINT, "max_memory=MIB of plugstack.conf: the data the check may add "
          "to what its process has (0: no limit; grace_policy/checker/confine.py)"),
)

#: The fields the frame carries, in its order.
FRAME = tuple(f for f in STEP if f.kind != OPAQUE)

#: What ``grace_py_decide`` returns, by the bridge's action. 0 is never a
#: verdict (cffi returns 0 when its own start-up failed), -1 neither
#: (``def_extern(error=-1)``, an escaped exception).
RC = (("allow", 1), ("warn", 2), ("reject", 3),
      ("error", 4))  # the check could not be made; the failure and the reason were emitted
RC_CODES = dict(RC)

#: What Python hands back through ``grace_emit(result, kind, text)``, in the
#: order it emits them (``done`` last: C trusts no verdict without it).
EMIT = (
    ("user", 1, 'a line for the user ("grace-policy: ...")'),
    ("unset", 2, "a variable name to remove from the step env"),
    ("set", 3, '"NAME=VALUE" to set in the step env'),
    ("log", 4, "a line for slurmd's log only (error reasons)"),
    ("done", 5, "the bridge reached its end: the result is complete"),
    ("cache", 6, "a verdict-cache entry (grace_policy/verdict_cache.py format)"),
    ("fail", 7, "with rc error: the kind of failure, one of FAILURES' names"),
    ("pull", 8, "pyxis imports this step's image in its task_init: the root it makes is "
     "judged there (spank/grace_afterpull.c); a verdict without it was on the files"),
)
EMIT_CODES = {name: code for name, code, _doc in EMIT}

#: The records a helper (slurmstepd's own, the pre-started one, a node
#: checker's child) sends back: one byte of kind, a u32 length (host
#: order), the bytes. Each emission kind travels as the record of its name.
RECORDS = (
    ("accepted", "A", "pre-started helper, node checker: it took the step (first)"),
    ("user", "U", "an emitted user line"),
    ("unset", "X", "an emitted unset"),
    ("set", "S", "an emitted set"),
    ("log", "L", "an emitted log line"),
    ("cache", "C", "the emitted verdict-cache entry"),
    ("done", "D", "DONE was emitted"),
    ("fail", "F", "the emitted failure kind"),
    ("oom", "O", "an allocation failed: the result is incomplete"),
    ("error", "E", "the helper could not load or start the Python part: the reason "
     "(failure python)"),
    ("hit", "H", "the verdict cache answered: its mode"),
    ("hit_ms", "T", "when the lookup ended (ms since user_init began)"),
    ("rc", "R", "the return code, decimal"),
    ("miss", "M", "the lookup missed; the pre-started helper or node checker decides"),
    ("stale", "V", "node checker: it runs another install, or a changed one: why"),
    ("pull", "P", "PULL was emitted"),
    ("end", "Z", "the helper reached its end (last; nothing is trusted without it)"),
)
RECORD = {name: letter for name, letter, _doc in RECORDS}

#: The kinds of failure in a failure's audit line (``"failure"``; counted
#: apart by grace-policy report): C's macro suffix, the name, when.
FAILURES = (
    ("ARGS", "plugstack", "plugstack.conf arguments unusable"),
    ("TIMEOUT", "timeout", "no verdict within timeout_ms"),
    ("PYTHON", "python", "the Python part cannot be loaded or started"),
    ("CONFIG", "config", "the config cannot be read or is invalid"),
    ("CHECK", "check", "the check failed in another way"),
    ("ENV", "env", "an env edit the verdict needs failed"),
    ("INTERNAL", "internal", "out of memory, no helper process, ..."),
    ("CHECKER", "checker", "the node checker was unusable: checked in slurmstepd"),
)
FAIL_ARGS, FAIL_TIMEOUT, FAIL_PYTHON, FAIL_CONFIG, FAIL_CHECK, FAIL_ENV, FAIL_INTERNAL, \
    FAIL_CHECKER = (name for _macro, name, _doc in FAILURES)
#: What Python may name with ``fail`` (the others are C's own).
PYTHON_FAILURES = (FAIL_ARGS, FAIL_PYTHON, FAIL_CONFIG, FAIL_CHECK)

#: Starts the log item that carries the decision's audit line (C writes it
#: once the verdict is applied).
AUDIT_MARK = "\x1e"

#: The credentials frame slurmstepd sends before the step (grace_put_creds):
#: these ids as u32, then the supplementary groups (a count, the gids).
CREDS_IDS = ("ruid", "euid", "suid", "rgid", "egid", "sgid")
#: The node checker's request continues it with: the ms left until the
#: deadline (u32), the sender's install (TEXT, as :func:`code`) and
#: slurmstepd's PATH (TEXT).
REQUEST_TAIL = (("left_ms", UINT), ("code", TEXT), ("path", TEXT))

#: The node checker's entry, started by grace_node.c in slurmd:
#: ``from MODULE import FUNCTION; sys.exit(FUNCTION(argv))``.
CHECKER_MODULE = "grace_policy.nodecheck"
CHECKER_FUNCTION = "main"

#: argv[0] names of programs whose image is one of their arguments
#: (``apptainer exec IMG CMD``): judged by the core after the host program
#: (decide), never stored nor replayed by the verdict cache, which keys on
#: no argument (slurm_bridge, grace_cache.c).
IMAGE_WRAPPERS = ("apptainer", "singularity")

#: :func:`code`'s parts.
CODE_SEP = "|"
CODE_NO_PATH = "-"


def wraps_an_image(argv0: str) -> bool:
    """Is argv[0] a program that runs an image named later in argv? A name
    test, paid by every host step (grace_cache.c grace_wraps_an_image)."""
    return argv0.rpartition("/")[2] in IMAGE_WRAPPERS


def code(plugin_dir: str, python_path: str | None) -> str:
    """Which install runs a check, as C names it (grace_contract.c
    grace_code): an input of every verdict-cache entry and what the node
    checker compares with its own."""
    return f"{plugin_dir}{CODE_SEP}{CODE_NO_PATH if python_path is None else python_path}"


def format_credentials(egid: int, groups: Iterable[int]) -> str:
    """The rights a check runs with, ``<egid>:<sorted unique gids>`` (as
    grace_contract.c grace_creds_format): which files a user may read
    depends on their groups, not only on the files' identity."""
    return f"{egid}:" + ",".join(str(g) for g in sorted(set(groups)))
