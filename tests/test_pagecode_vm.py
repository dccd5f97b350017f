"""Issue 11 on real large-page kernels: the jemalloc builds and the .bss
case of ``test_pagecode.py`` / ``test_bss_clobber.py``, run by a real 64 KiB
and a real 16 KiB arm64 kernel (issue 10's ``tests/vm``: qemu-system-aarch64,
Debian's glibc 2.36 userland), must do what the rules predict for a node with
that page size.

Needs ``tests/vm`` (issue 10); until that is merged this module is skipped
as a whole, with that reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from corpus import jemalloc_or_skip
from fixtures.build import src

from grace_policy import pagecode
from grace_policy.budget import Budget
from grace_policy.elf import read_elf
from grace_policy.layout import page_issues
from grace_policy.loader import Loading
from grace_policy.node import NodeProfile

images = pytest.importorskip("vm.images", reason="needs tests/vm (issue 10's kernels)")
vm_qemu = pytest.importorskip("vm.qemu", reason="needs tests/vm (issue 10's kernels)")

pytestmark = [pytest.mark.network, pytest.mark.cross]

CC = "aarch64-linux-gnu-gcc"

RUN = """#!/bin/sh
echo "PAGESIZE $(/cases/pagesize)"
for p in use-lg12 use-lg16; do /cases/$p; echo "RC $p $?"; done
LD_LIBRARY_PATH=/cases/bss /cases/use_bss; echo "RC bss-patched $?"
LD_LIBRARY_PATH=/cases/bssorig /cases/use_bss; echo "RC bss-orig $?"
"""

INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /dev /tmp
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
u=/u/glibc236
for d in dev tmp cases; do $B mkdir -p $u/$d; done
$B mount -t devtmpfs dev $u/dev
$B mount -o bind /cases $u/cases
$B chroot $u /bin/busybox sh /cases/run.sh > /dev/hvc0 2>&1
echo ALLDONE > /dev/hvc0
$B poweroff -f
"""

PAGESIZE_C = "#include <stdio.h>\n#include <unistd.h>\n" \
    'int main(void) { printf("%ld\\n", sysconf(_SC_PAGESIZE)); return 0; }\n'


def _cc(*args: str) -> None:
    subprocess.run([CC, "-O1", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which(CC) is None or shutil.which("patchelf") is None:
        pytest.skip(f"{CC} or patchelf not installed")
    work = tmp_path_factory.mktemp("pagecode-vm")
    d = work / "cases"
    (d / "bss").mkdir(parents=True)
    (d / "bssorig").mkdir()
    for lg in (12, 16):
        _cc("-o", str(d / f"use-lg{lg}"), str(src("jemalloc_use.c")), str(jemalloc_or_skip(lg)),
            "-lpthread", "-Wl,-z,max-page-size=65536")
    (work / "pagesize.c").write_text(PAGESIZE_C)
    _cc("-o", str(d / "pagesize"), str(work / "pagesize.c"))
    _cc("-shared", "-fPIC", "-o", str(d / "bss" / "libbss.so"), str(src("libbss.c")),
        "-Wl,-soname,libbss.so")
    shutil.copy(d / "bss" / "libbss.so", d / "bssorig" / "libbss.so")
    _cc("-o", str(d / "use_bss"), str(src("use_bss.c")), f"-L{d / 'bss'}", "-lbss")
    subprocess.run(["patchelf", "--page-size", "4096", "--set-rpath", "/opt/" + "x" * 300,
                    str(d / "bss" / "libbss.so")], check=True, capture_output=True)
    (d / "run.sh").write_text(RUN)
    return d


@pytest.mark.parametrize("kernel", ["64k", "16k"])
def test_real_kernel_does_what_the_rules_predict(cases: Path, kernel: str) -> None:
    if vm_qemu.qemu_binary() is None:
        pytest.skip("qemu-system-aarch64 not installed")
    work = cases.parent
    user = images.userland("glibc236")
    initrd = work / f"initrd-{kernel}.cpio"
    vm_qemu.cpio_newc(initrd, [(user, "u/glibc236"), (cases, "cases")], extra=[
        ("init", INIT.encode(), 0o755),
        ("bin/busybox", (user / "bin" / "busybox").read_bytes(), 0o755)])
    image = images.kernel_64k() if kernel == "64k" else images.kernel_16k()
    console, _log, _secs = vm_qemu.boot(image, initrd, work, timeout=600)
    assert "ALLDONE" in console, console
    lines = console.splitlines()
    page = int(next(line.split()[1] for line in lines if line.startswith("PAGESIZE")))
    assert page == (65536 if kernel == "64k" else 16384)
    rc = {parts[1]: int(parts[2]) for parts in (line.split() for line in lines)
          if len(parts) == 3 and parts[0] == "RC"}
    node = NodeProfile(machine="aarch64", page_size=page, glibc=(2, 36), root_is_native=False)
    for lg in (12, 16):
        exe = cases / f"use-lg{lg}"
        predicted = pagecode.compiled_page_issues(str(exe), read_elf(str(exe)), node,
                                                  Loading(budget=Budget()))
        assert (rc[f"use-lg{lg}"] == 3) == bool(predicted), (lg, console)
    assert console.count("<jemalloc>: Unsupported system page size") >= 1
    for name, lib in (("bss-patched", cases / "bss" / "libbss.so"),
                      ("bss-orig", cases / "bssorig" / "libbss.so")):
        rules = [i.rule for i in page_issues(str(lib), read_elf(str(lib)), node,
                                             mapped_by_kernel=False,
                                             how=Loading(budget=Budget()))]
        assert (rc[name] == 1) == ("page-bss-clobber" in rules), (name, console)
    assert rc["use-lg12"] == 3 and rc["bss-patched"] == 1   # both failures really happen


PY_INIT = """#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /dev /tmp
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
u=/u/py
for d in dev tmp proc sp; do $B mkdir -p $u/$d; done
$B mount -t devtmpfs dev $u/dev
$B mount -t proc proc $u/proc
for w in polars duckdb; do
  $B mount -o bind /wheels/$w $u/sp
  $B chroot $u /usr/bin/python3.11 -I /probe_$w.py > /dev/hvc0 2>&1
  echo "RC $w $?" > /dev/hvc0
  $B umount $u/sp
done
echo ALLDONE > /dev/hvc0
$B poweroff -f
"""


@pytest.mark.qemu
@pytest.mark.parametrize("kernel", ["64k", "16k"])
def test_real_kernel_imports_fail_where_the_rule_says(tmp_path: Path, kernel: str) -> None:
    """Debian 12's aarch64 CPython imports polars 0.14.8 and duckdb 0.9.2 on
    the real kernel: each import fails exactly when page-size-compiled
    reports its extension module for that page size."""
    from corpus import DUCKDB_16K, POLARS_4K, debian_arm64_python_or_skip, wheel_or_skip
    from test_pagecode import IMPORT_PROBE

    if vm_qemu.qemu_binary() is None:
        pytest.skip("qemu-system-aarch64 not installed")
    root = debian_arm64_python_or_skip()
    wheels = {"polars": (wheel_or_skip(POLARS_4K), "polars/polars.abi3.so",
                         "import polars; polars.DataFrame({'a': [1]})"),
              "duckdb": (wheel_or_skip(DUCKDB_16K),
                         "duckdb/duckdb.cpython-311-aarch64-linux-gnu.so",
                         "import duckdb; duckdb.sql('select 42').fetchall()")}
    user = images.userland("glibc236")
    extra = [("init", PY_INIT.encode(), 0o755),
             ("bin/busybox", (user / "bin" / "busybox").read_bytes(), 0o755)]
    trees = [(root, "u/py")]
    for name, (corpus, _member, statement) in wheels.items():
        trees.append((corpus.root / "site-packages", f"wheels/{name}"))
        extra.append((f"u/py/probe_{name}.py",
                      IMPORT_PROBE.format(site="/sp", statement=statement).encode(), 0o644))
    initrd = tmp_path / "initrd.cpio"
    vm_qemu.cpio_newc(initrd, trees, extra=extra)
    image = images.kernel_64k() if kernel == "64k" else images.kernel_16k()
    console, _log, _secs = vm_qemu.boot(image, initrd, tmp_path, timeout=900, memory_mib=2048)
    assert "ALLDONE" in console, console
    rc = {parts[1]: int(parts[2]) for parts in (line.split() for line in console.splitlines())
          if len(parts) == 3 and parts[0] == "RC"}
    node = NodeProfile(machine="aarch64", page_size=65536 if kernel == "64k" else 16384,
                       glibc=(2, 36), root_is_native=False)
    for name, (corpus, member, _statement) in wheels.items():
        module = corpus.root / "site-packages" / member
        predicted = pagecode.compiled_page_issues(str(module), read_elf(str(module)), node,
                                                  Loading(budget=Budget()))
        assert (rc[name] != 0) == bool(predicted), (name, console)
    assert rc["polars"] == 134 and "<jemalloc>: Unsupported system page size" in console
