"""The page oracle: what the plugin predicts for a file on a large-page node,
against what a real large-page kernel and real glibc do with it.

Each :class:`Case` is one file used one way:

* ``exec``: a program started by the kernel (execve maps it and its PT_INTERP);
* ``needed``: a library found through DT_NEEDED of a clean 64 KiB program
  (``LD_LIBRARY_PATH`` names its directory);
* ``ldso``: a library mapped by ``ld.so --list FILE`` (the loader's own
  ``_dl_map_object``, as for any DT_NEEDED);
* ``dlopen``: a library opened with ``dlopen(path, RTLD_LAZY)``.

The cases run in the VM in both userlands (glibc 2.31: before the 2.35
relaxation of the p_align check; 2.36: after) with :program:`pagerun`, and
the plugin judges the same files on a :class:`~grace_policy.node.NodeProfile`
that *is* the guest: its page size, its glibc, its root (the same userland
tree, unpacked on this host). Outcomes are compared as kinds:

* ``kernel``: execve refused the program (killed by SIGSEGV/SIGBUS before it
  printed anything, or execve failed);
* ``loader``: glibc refused a mapping; its text must contain the plugin's
  predicted error;
* ``runs``: no page failure (a fixture must also print what it prints on
  this host; a corpus file may fail later for other reasons, e.g. a missing
  dependency or a glibc symbol version: that is not a page outcome and is
  reported as such);
* anything else (a crash after start, a timeout) is ``other`` and never
  agrees with a prediction.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elfpatch import set_load_align
from fixtures.build import CompileCache, compile_c, src
from roomy import ROOMY

from grace_policy.decide import StepRequest, action_for, decide, finding_context
from grace_policy.elf import ET_DYN, ET_EXEC, ElfError, read_elf
from grace_policy.findings import Finding
from grace_policy.layout import page_issues
from grace_policy.node import NodeProfile
from grace_policy.policy import Policy
from grace_policy.rules import Catalogue

from . import images
from .qemu import boot, cpio_newc

PAGERUN_SRC = Path(__file__).resolve().parent / "src" / "pagerun.c"
LOADER = "/lib/ld-linux-aarch64.so.1"
CASES = "/cases"
LIB_MODES = ("needed", "ldso", "dlopen")
PREFIX = "error while loading shared libraries: "

#: The kernels: name -> (page size, how to get the Image).
KERNELS = {"64k": (65536, images.kernel_64k), "16k": (16384, images.kernel_16k)}

#: Library fixtures: name -> (max-page-size, extra ld flags, p_align patch of the
#: last PT_LOAD or None). The same shapes tests/test_layout.py judges.
LIB_FIXTURES: dict[str, tuple[int, tuple[str, ...], int | None]] = {
    "4k": (4096, (), None),
    "16k": (16384, (), None),
    "64k": (65536, (), None),
    "4k-separate-code": (4096, ("-Wl,-z,separate-code",), None),
    "4k-noseparate-code": (4096, ("-Wl,-z,noseparate-code",), None),
    "16k-noseparate-code": (16384, ("-Wl,-z,noseparate-code",), None),
    "64k-last-align-4k": (65536, (), 4096),
    "4k-separate-code-last-align-64k": (4096, ("-Wl,-z,separate-code",), 65536),
    # glibc <= 2.34 tests congruence modulo p_align: on 16 KiB pages this one
    # is "not properly aligned" there and loads on 2.35+.
    "16k-last-align-64k": (16384, (), 65536),
}
#: Program fixtures (hello.c): name -> (max-page-size, extra gcc flags).
EXE_FIXTURES: dict[str, tuple[int, tuple[str, ...]]] = {
    "4k-pie": (4096, ("-pie",)),
    "4k-nopie": (4096, ("-no-pie",)),
    "4k-static": (4096, ("-static",)),
    "4k-static-pie": (4096, ("-static-pie",)),
    "4k-noseparate-code": (4096, ("-Wl,-z,noseparate-code",)),
    "16k-pie": (16384, ("-pie",)),
    "16k-static": (16384, ("-static",)),
    "64k-pie": (65536, ("-pie",)),
    "64k-nopie": (65536, ("-no-pie",)),
    "64k-static": (65536, ("-static",)),
    "64k-static-pie": (65536, ("-static-pie",)),
}

PAGESIZE_C = """#include <stdio.h>
#include <unistd.h>
int main(void) { printf("%ld\\n", sysconf(_SC_PAGESIZE)); return 0; }
"""


@dataclass(frozen=True)
class Case:
    id: str
    mode: str                 # exec | needed | ldso | dlopen
    file: str                 # node path of the file judged
    argv: tuple[str, ...]     # node argv (exec-like modes)
    env: str = "-"            # "-" or NAME=VALUE for the child
    expect_stdout: str | None = None  # fixtures: what a clean run prints
    origin: str = "fixture"   # fixture | debian | wheel

    def line(self) -> str:
        runner_mode = "dlopen" if self.mode == "dlopen" else "exec"
        args = (self.file,) if self.mode == "dlopen" else self.argv
        return "\t".join((self.id, runner_mode, self.env, *args))


@dataclass(frozen=True)
class Result:
    how: str      # exit | signal | errno | timeout
    value: int
    out: str
    err: str


@dataclass(frozen=True)
class Outcome:
    kind: str     # runs | kernel | loader | other
    text: str = ""
    rule: str | None = None
    action: str | None = None
    note: str = ""


@dataclass
class CaseSet:
    """The files of one oracle run, laid out as ``/cases`` in the guest."""

    cases_dir: Path           # host dir that is /cases
    cases: list[Case] = field(default_factory=list)
    trees: list[tuple[Path, str]] = field(default_factory=list)  # extra trees in /cases

    def add(self, case: Case) -> None:
        self.cases.append(case)


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "x" and i + 3 < len(text):
                out.append(chr(int(text[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_console(text: str) -> dict[str, dict[str, Result]]:
    """``{userland: {case id: Result}}`` from the guest's console; a userland
    whose runner did not print ``END`` is missing (the caller fails)."""
    runs: dict[str, dict[str, Result]] = {}
    current: str | None = None
    pending: dict[str, Result] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if parts[0] == "USERLAND" and len(parts) == 2:
            current, pending = parts[1], {}
        elif parts[0] == "R" and len(parts) == 6 and current is not None:
            pending[parts[1]] = Result(parts[2], int(parts[3]), _unescape(parts[4]),
                                       _unescape(parts[5]))
        elif parts[0] == "END" and current is not None:
            runs[current] = pending
            current = None
    return runs


def observed(case: Case, res: Result) -> Outcome:
    if case.mode == "dlopen":
        if res.how == "exit" and res.out.startswith("DLOPEN-OK"):
            return Outcome("runs")
        if res.how == "exit" and res.out.startswith("DLOPEN-ERR:"):
            text = res.out[len("DLOPEN-ERR:"):].strip()
            if "ELF load command" in text:
                return Outcome("loader", text)
            return Outcome("runs", note=f"mapped, then: {text}")
        return Outcome("other", f"{res.how} {res.value}: {res.out}{res.err}".strip())
    if "ELF load command" in res.err:
        return Outcome("loader", res.err.strip())
    if res.how == "errno":
        return Outcome("kernel", f"execve failed: {os.strerror(res.value)}")
    if (res.how == "signal" and res.value in (signal.SIGSEGV, signal.SIGBUS)
            and not res.out and not res.err):
        return Outcome("kernel", f"killed by {signal.Signals(res.value).name} at start")
    if case.expect_stdout is not None:
        if res.how == "exit" and res.value == 0 and res.out == case.expect_stdout:
            return Outcome("runs")
        return Outcome("other", f"{res.how} {res.value}: out {res.out!r} err {res.err!r}")
    if res.how in ("exit", "signal") and not (res.how == "signal" and not res.out
                                              and not res.err):
        note = "" if res.how == "exit" and res.value == 0 else (
            f"mapped, then {res.how} {res.value}: {res.err.strip()[:200]}")
        return Outcome("runs", note=note)
    return Outcome("other", f"{res.how} {res.value}: out {res.out!r} err {res.err!r}")


def node_for(root: Path, page: int, glibc: tuple[int, int]) -> NodeProfile:
    """The guest as the plugin detects it there, with its root on this host."""
    return NodeProfile(machine="aarch64", page_size=page, glibc=glibc, root=str(root),
                       root_is_native=True)


def _first_page_error(findings: Iterable[Finding]) -> Finding | None:
    return next((f for f in findings if f.rule.startswith("page-") and f.severity == "error"),
                None)


def predicted(case: Case, node: NodeProfile) -> Outcome:
    """The plugin's prediction: the verdict for a step (exec, needed) or the
    page rules of the library as ld.so maps it (ldso, dlopen)."""
    root = node.root.rstrip("/")

    def guest(text: str) -> str:
        return text.replace(root + "/", "/")

    if case.mode in ("exec", "needed"):
        env = {"PATH": "/usr/bin:/bin"}
        if case.env != "-":
            name, _, value = case.env.partition("=")
            env[name] = value
        verdict = decide(ROOMY, StepRequest(partition=None,
                                            argv=[root + case.argv[0], *case.argv[1:]], env=env,
                                            cwd="/", node=node))
        if verdict.error:
            return Outcome("other", f"check failed: {verdict.error}", action=verdict.action)
        exe = case.argv[0]
        kernel = next((f for f in verdict.findings if f.rule == "page-congruence"
                       and guest(f.path) in (exe, LOADER)), None)
        if kernel is not None:
            return Outcome("kernel", guest(kernel.predicted_error), kernel.rule, verdict.action)
        first = _first_page_error(verdict.findings)
        if first is not None:
            return Outcome("loader", guest(first.predicted_error), first.rule, verdict.action)
        return Outcome("runs", action=verdict.action,
                       note=", ".join(sorted({f.rule for f in verdict.findings})))
    info = read_elf(root + case.file)
    issues = page_issues(case.file, info, node, mapped_by_kernel=False)
    findings = Catalogue.for_policy(Policy()).findings(issues, finding_context(node, None))
    action = action_for("enforce", findings)
    first = _first_page_error(findings)
    if first is not None:
        return Outcome("loader", first.predicted_error, first.rule, action)
    return Outcome("runs", action=action, note=", ".join(sorted({f.rule for f in findings})))


def agrees(case: Case, want: Outcome, got: Outcome) -> str | None:
    """None when prediction and observation agree, else why not."""
    if got.kind == "other" or want.kind == "other":
        return f"predicted {want.kind} {want.text!r}, observed {got.kind} {got.text!r}"
    if want.kind != got.kind:
        return (f"predicted {want.kind} ({want.rule}: {want.text!r}), "
                f"observed {got.kind} {got.text!r}")
    if want.kind == "loader":
        text = want.text[len(PREFIX):] if want.text.startswith(PREFIX) else want.text
        if text not in got.text:
            return f"predicted error {want.text!r}, glibc said {got.text!r}"
    if want.kind != "runs" and want.action != "reject":
        return f"{want.kind} failure predicted, but the verdict is {want.action}"
    if want.kind == "runs" and case.origin == "fixture" and want.action == "reject":
        return f"ran, but the verdict is reject ({want.note})"
    return None


# --------------------------------------------------------------------------
# Building the case set
# --------------------------------------------------------------------------


def build_fixtures(cs: CaseSet, cache: CompileCache | None) -> None:
    """Compile every page fixture for aarch64 against glibc 2.31 (so each runs
    in both userlands) into ``cases_dir/fx`` and add their cases."""
    flags = images.sysroot_flags(images.sysroot_231())
    fx = cs.cases_dir / "fx"

    def cc(source: object, out: Path, page: int, extra: Sequence[str], **kw: object) -> Path:
        # A static program carries its libc: the cross toolchain's own (gcc 12's
        # libgcc_eh wants glibc 2.35's _dl_find_object) runs under any userland.
        static = any(f in ("-static", "-static-pie") for f in extra)
        return compile_c(source, out, arch="aarch64", page_size=page,  # type: ignore[arg-type]
                         extra_flags=(*(() if static else flags), *extra), cache=cache,
                         **kw)  # type: ignore[arg-type]

    cc(PAGESIZE_C, fx / "bin/pagesize", 65536, ())
    cs.add(Case("probe-pagesize", "exec", f"{CASES}/fx/bin/pagesize",
                (f"{CASES}/fx/bin/pagesize",), origin="probe"))
    cc(PAGERUN_SRC, cs.cases_dir / "pagerun", 65536, ("-ldl",))
    for name, (page, extra, align) in LIB_FIXTURES.items():
        lib = cc(src("libgreet.c"), fx / f"lib/{name}/libgreet.so.1", page, extra,
                 shared=True, soname="libgreet.so.1")
        if align is not None:
            set_load_align(lib, -1, align)
        node_lib = f"{CASES}/fx/lib/{name}/libgreet.so.1"
        cs.add(Case(f"lib-{name}-needed", "needed", node_lib, (f"{CASES}/fx/bin/use_greet",),
                    env=f"LD_LIBRARY_PATH={CASES}/fx/lib/{name}", expect_stdout=""))
        cs.add(Case(f"lib-{name}-ldso", "ldso", node_lib, (LOADER, "--list", node_lib)))
        cs.add(Case(f"lib-{name}-dlopen", "dlopen", node_lib, ()))
    # The program that needs libgreet: 64 KiB, linked against the 64 KiB build.
    cc(src("use_greet.c"), fx / "bin/use_greet", 65536,
       (str(fx / "lib/64k/libgreet.so.1"),))
    for name, (page, extra) in EXE_FIXTURES.items():
        cc(src("hello.c"), fx / f"bin/hello-{name}", page, extra)
        exe = f"{CASES}/fx/bin/hello-{name}"
        cs.add(Case(f"exe-{name}", "exec", exe, (exe,), expect_stdout="hello\n"))


def _is_library(name: str) -> bool:
    return ".so" in name


def corpus_cases(cs: CaseSet, origin: str, root: Path, files: Sequence[Path],
                 sample: int | None) -> None:
    """Cases for real aarch64 files under ``root`` (the tree goes into the
    guest at ``/cases/corpus/ORIGIN``): programs by execve with --version,
    libraries by ld.so and dlopen. ``sample``: that many files, picked by a
    hash of their path (the same ones every run)."""
    chosen = list(files)
    if sample is not None and len(chosen) > sample:
        chosen = sorted(chosen, key=lambda p: hashlib.sha256(
            str(p.relative_to(root)).encode()).hexdigest())[:sample]
        chosen.sort()
    cs.trees.append((root, f"corpus/{origin}"))
    for i, path in enumerate(chosen):
        try:
            info = read_elf(str(path))
        except (ElfError, OSError):
            continue
        if info.machine_name != "aarch64" or info.e_type not in (ET_EXEC, ET_DYN):
            continue
        node_path = f"{CASES}/corpus/{origin}/{path.relative_to(root)}"
        tag = f"{origin}{i:04d}"
        if _is_library(path.name):
            cs.add(Case(f"{tag}-ldso", "ldso", node_path, (LOADER, "--list", node_path),
                        origin=origin))
            cs.add(Case(f"{tag}-dlopen", "dlopen", node_path, (), origin=origin))
        else:
            cs.add(Case(f"{tag}-exec", "exec", node_path, (node_path, "--version"),
                        origin=origin))


def node_root(work: Path, userland: str, cs: CaseSet) -> Path:
    """This host's copy of what the guest sees for ``userland``: the root with
    ``/cases`` (hard links where the filesystem allows)."""
    root = work / f"node-{userland}"
    if root.exists():
        shutil.rmtree(root)
    _link_tree(images.userland(userland), root)
    _link_tree(cs.cases_dir, root / "cases")
    for tree, prefix in cs.trees:
        _link_tree(tree, root / "cases" / prefix)
    return root


def _link_tree(src_dir: Path, dest: Path) -> None:
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src_dir, dest, symlinks=True, copy_function=link, dirs_exist_ok=True)


INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /dev /tmp
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for u in {userlands}; do
  for d in dev tmp cases; do $B mkdir -p /u/$u/$d; done
  $B mount -t devtmpfs dev /u/$u/dev
  $B mount -t tmpfs tmp /u/$u/tmp
  $B mount -o bind /cases /u/$u/cases
  echo "USERLAND	$u" > /dev/hvc0
  $B chroot /u/$u /cases/pagerun /cases/list > /dev/hvc0 2>&1
done
echo "ALLDONE" > /dev/hvc0
$B poweroff -f
"""


def initramfs(work: Path, cs: CaseSet, userlands: Sequence[str]) -> Path:
    out = work / "initrd.cpio"
    (cs.cases_dir / "list").write_text("".join(c.line() + "\n" for c in cs.cases))
    busybox = images.userland(userlands[-1]) / "bin/busybox"
    trees = [(images.userland(u), f"u/{u}") for u in userlands]
    trees += [(cs.cases_dir, "cases"), *((t, f"cases/{p}") for t, p in cs.trees)]
    cpio_newc(out, trees, extra=[
        ("init", INIT.format(userlands=" ".join(userlands)).encode(), 0o755),
        ("bin/busybox", busybox.read_bytes(), 0o755),
    ])
    return out


@dataclass(frozen=True)
class Row:
    kernel: str
    userland: str
    case: Case
    want: Outcome
    got: Outcome
    problem: str | None


def run_kernel(kernel: str, work: Path, cs: CaseSet, *, timeout: float
               ) -> tuple[list[Row], float, str]:
    """Boot ``kernel`` once with every case in both userlands; one row per
    (userland, case). Returns the rows, the boot's seconds and the console."""
    page, image = KERNELS[kernel]
    userlands = list(images.USERLANDS)
    initrd = initramfs(work, cs, userlands)
    console, log, seconds = boot(image(), initrd, work, timeout=timeout,
                                 memory_mib=1536)
    (work / f"console-{kernel}.txt").write_text(console)
    (work / f"serial-{kernel}.txt").write_text(log)
    runs = parse_console(console)
    rows: list[Row] = []
    for userland in userlands:
        got_all = runs.get(userland)
        if got_all is None:
            raise AssertionError(f"{kernel}: the {userland} runner did not finish; "
                                 f"console tail: {console[-800:]!r}; serial: {log[-800:]!r}")
        node = node_for(node_root(work, userland, cs), page, images.USERLANDS[userland][1])
        for case in cs.cases:
            res = got_all.get(case.id)
            if res is None:
                rows.append(Row(kernel, userland, case, Outcome("other"),
                                Outcome("other", "no result"), "no result from the guest"))
                continue
            if case.origin == "probe":
                # Not a prediction: proof that the guest runs the page size we think.
                want = Outcome("runs", f"{page}\n")
                got = Outcome("runs" if res.out == f"{page}\n" else "other", res.out)
                rows.append(Row(kernel, userland, case, want, got,
                                None if got.kind == "runs" else
                                f"the guest's page size is {res.out!r}, not {page}"))
                continue
            want, got = predicted(case, node), observed(case, res)
            rows.append(Row(kernel, userland, case, want, got, agrees(case, want, got)))
    return rows, seconds, console
