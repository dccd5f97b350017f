"""The command of an ``srun`` line, and what ``--export`` gives it.

srun's options are read the way its getopt_long does: a short option that
takes a value takes the rest of its word or the next word, a long one
``--opt=V`` or ``--opt V``. An option this table does not know leaves the
line unjudged (its value could be the command we would otherwise judge).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: Short options of srun (22.05-26.05) that take a value.
_SHORT_VALUE = frozenset("ABCDGJLMNSTWcdeimnoprtwx")
#: Short options without a value.
_SHORT_FLAG = frozenset("EHIKOQXZhlsuvVkY")
#: Long options that take a value (``--opt V`` or ``--opt=V``).
_LONG_VALUE = frozenset("""
account acctg-freq bb bbf begin bcast bcast-exclude chdir cluster-constraint clusters
comment compress constraint container container-id core-spec cores-per-socket
cpu-bind cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution
error epilog export extra gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket
gpus-per-task gres gres-flags hint input job-name jobid kill-on-bad-exit label licenses
mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus mpi
network nice nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
ntasks-per-node ntasks-per-socket open-mode output partition power prefer priority
profile prolog propagate qos quit-on-interrupt reservation resv-ports segment signal
slurmd-debug sockets-per-node spread-job switches task-epilog task-prolog
thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid
wait wckey exclude cpus-per-task stepmgr grace-policy container-image container-mounts
container-workdir container-name container-save container-env
""".split())
#: Long options without a value (a few take an optional ``=V``).
_LONG_FLAG = frozenset("""
exact exclusive overlap oversubscribe overcommit no-kill kill-on-bad-exit label
unbuffered verbose quiet disable-status immediate pty test-only contiguous
no-allocate multi-prog hold usage help version wait-all-nodes external-launcher
mem-bind cpu-bind accel-bind x11 send-libs whole
""".split())


def srun_command(argv: Sequence[str]) -> tuple[list[str], dict[str, str]] | None:
    """``argv`` of an srun line (argv[0] is srun) -> (the step's command, the
    long options given with a value); None when a word is not understood,
    ``--multi-prog`` or ``--pack-group`` lines, or no command."""
    opts: dict[str, str] = {}
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if word.startswith("--"):
            name, eq, val = word[2:].partition("=")
            if name in ("multi-prog", "het-group", "pack-group"):
                return None
            if eq:
                if name not in _LONG_VALUE and name not in _LONG_FLAG:
                    return None
                opts[name] = val
                i += 1
                continue
            if name in _LONG_FLAG:
                i += 1
                continue
            if name in _LONG_VALUE:
                if i + 1 >= len(argv):
                    return None
                opts[name] = argv[i + 1]
                i += 2
                continue
            return None
        if word.startswith("-") and len(word) > 1:
            j = 1
            while j < len(word):
                ch = word[j]
                if ch in _SHORT_VALUE:
                    rest = word[j + 1:]
                    if not rest:
                        if i + 1 >= len(argv):
                            return None
                        rest = argv[i + 1]
                        i += 1
                    if ch == "D":
                        opts["chdir"] = rest
                    elif ch == "p":
                        opts["partition"] = rest
                    break
                if ch not in _SHORT_FLAG:
                    return None
                j += 1
            i += 1
            continue
        break
    command = list(argv[i:])
    return (command, opts) if command else None


def apply_export(rule: str | None, env: Mapping[str, str]) -> dict[str, str] | None:
    """The environment ``--export=RULE`` gives a step from ``env``: ``ALL``
    (the default), ``NONE`` (only Slurm's own variables: the step would find
    its programs with slurmstepd's PATH, which a reader does not know: None),
    ``[ALL,]NAME[=VALUE],...``. None for what cannot be known."""
    if rule is None or rule == "" or rule.upper() == "ALL":
        return dict(env)
    parts = [p for p in rule.split(",") if p]
    out: dict[str, str] = {}
    base_all = False
    if parts and parts[0].upper() in ("ALL", "NIL"):
        base_all = parts[0].upper() == "ALL"
        parts = parts[1:]
    elif parts and parts[0].upper() == "NONE":
        return None
    if base_all:
        out.update(env)
    else:
        out.update({k: v for k, v in env.items() if k.startswith("SLURM_")})
    for part in parts:
        name, eq, val = part.partition("=")
        if eq:
            out[name] = val
        elif name in env:
            out[name] = env[name]
    if "PATH" not in out:
        return None  # slurmd's PATH decides where the program is found
    return out
