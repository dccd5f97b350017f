"""Python extensions inside a pyxis image on a real Slurm (issue 15):
``srun --container-image=IMG python3 -c 'import MOD'`` with pyxis 0.24.0 and
enroot 4.1.2 (test_containers.py's ``pyxis`` fixture).

The images are Debian bookworm roots with bookworm's own CPython 3.11.2
(``containers.debian_root(arch, "python")``: python3-minimal), and two
extension modules compiled here against that CPython's headers (bookworm's
libpython3.11-dev, unpacked beside, never in the image), named with its
EXT_SUFFIX: ``ext64k`` linked for 64 KiB pages, ``ext4k`` for 4 KiB only.
They lie where a user's image puts its code, ``/opt/app/site``, with
``ENV PYTHONPATH=/opt/app/site`` (enroot's ``/etc/environment``).

Which simulated 64 KiB partition shows what (both are ``gb200sim``):

* ``grace64k`` (x86_64, 64 KiB pages) refuses the amd64 image's ``ext4k`` in
  the loader's words; there Debian's amd64 python3 and libm are 4 KiB-linked
  too (every amd64 distribution build is), so every Python step of that
  image is refused: no step can run clean there.
* ``arm64-64k`` (aarch64, 64 KiB: GB200) judges the arm64 image, whose
  Debian python3 is 64 KiB-safe: ``ext4k`` refused, ``ext64k`` and the
  stdlib allowed (this x86_64 node then cannot exec the arm64 image:
  enroot's own ``Exec format error``, as in test_containers.py).

On the ordinary partition the amd64 image really runs: both modules load
and print, which proves the suffix and the ABI are the image's.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus import _give_up

from .test_containers import ENROOT_EXEC_ERROR, USERS, Pyxis, pyxis  # noqa: F401

pytestmark = pytest.mark.slurm

PREFIX = "grace-policy: "
SITE = "/opt/app/site"
#: Where `pip install` puts a package in a Debian-based image.
PIP_SITE = "/usr/local/lib/python3.11/dist-packages"
#: arch -> (Debian triplet, cross compiler); bookworm's CPython is 3.11.
ARCHES = {"amd64": ("x86_64-linux-gnu", "gcc"), "arm64": ("aarch64-linux-gnu",
                                                          "aarch64-linux-gnu-gcc")}
PAGES = {"ext64k": ("-Wl,-z,max-page-size=65536", "-Wl,-z,common-page-size=65536"),
         "ext4k": ("-Wl,-z,max-page-size=4096",)}
#: A module that says it was loaded: the step's output proves the import ran.
EXT_C = r"""
#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, MODNAME, NULL, -1, NULL};
PyMODINIT_FUNC INIT(void) {
    PySys_WriteStdout("%s loaded\n", MODNAME);
    return PyModule_Create(&def);
}
"""


def ext_name(module: str, arch: str) -> str:
    return f"{module}.cpython-311-{ARCHES[arch][0]}.so"


@dataclass
class PyImages:
    env: Pyxis
    #: arch -> the compiled modules (module -> file)
    exts: dict[str, dict[str, Path]]
    #: the images' roots, unpacked (the host-path oracle reads them)
    roots: dict[str, Path]

    def image(self, name: str) -> str:
        return f"{self.env.slurm.cluster.shared}/{name}.sqsh"


def _compile_ext(arch: str, module: str, out_dir: Path) -> Path:
    """``module`` for bookworm's CPython of ``arch``. Only its Python headers
    are taken from the -dev root (its own ``usr/include`` holds bookworm's
    libc headers too, which must not shadow the compiler's own)."""
    from . import containers

    triplet, cc = ARCHES[arch]
    dev = containers.debian_root(arch, "python-dev") / "usr" / "include"
    inc = out_dir / "include"
    for sub in ("python3.11", f"{triplet}/python3.11"):
        link = inc / sub
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(dev / sub)
    src = out_dir / "ext.c"
    src.write_text(EXT_C)
    out = out_dir / ext_name(module, arch)
    done = subprocess.run([cc, "-O1", "-shared", "-fPIC", f'-DMODNAME="{module}"',
                           f"-DINIT=PyInit_{module}", f"-I{inc}/python3.11", f"-I{inc}",
                           "-o", str(out), str(src), *PAGES[module]],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def pyimages(pyxis: Pyxis) -> Iterator[PyImages]:  # noqa: F811
    from . import containers

    try:
        for arch in ARCHES:
            for extra in ("python", "python-dev"):
                containers.debian_root(arch, extra)
    except containers.CorpusUnavailable as exc:
        _give_up(f"Debian CPython roots not available: {exc}")
    exts: dict[str, dict[str, Path]] = {}
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SITE}
    for arch in ARCHES:
        out = pyxis.work / "src" / f"py-{arch}"
        out.mkdir(parents=True, exist_ok=True)
        exts[arch] = {m: _compile_ext(arch, m, out) for m in PAGES}
    images = {  # name -> (arch, modules in /opt/app/site)
        "py": ("amd64", ("ext4k", "ext64k")),
        "pya4k": ("arm64", ("ext4k",)),
        "pya64k": ("arm64", ("ext64k",)),
    }
    roots: dict[str, Path] = {}
    # ext4k as `pip install` in a Dockerfile leaves it: the distribution's
    # /usr/local dist-packages, with its metadata, no PYTHONPATH.
    pip = pyxis.work / "root-pyapip"
    if pip.exists():
        shutil.rmtree(pip)
    shutil.copytree(containers.debian_root("arm64", "python"), pip, symlinks=True)
    inner = f"{PIP_SITE}/{ext_name('ext4k', 'arm64')}"
    info = f"{PIP_SITE}/ext4k-1.0.dist-info"
    containers._add_files(pip, {"PATH": "/usr/bin:/bin"}, {inner: exts["arm64"]["ext4k"]})
    (pip / info.lstrip("/")).mkdir()
    for file, text in (("METADATA", "Metadata-Version: 2.1\nName: ext4k\nVersion: 1.0\n"),
                       ("top_level.txt", "ext4k\n"),
                       ("RECORD", f"{Path(inner).name},,\next4k-1.0.dist-info/METADATA,,\n")):
        (pip / info.lstrip("/") / file).write_text(text)
    for d in (pip / PIP_SITE.lstrip("/"), pip / info.lstrip("/")):
        d.chmod(0o755)
    containers.mksquashfs(pip, pyxis.slurm.cluster.shared / "pyapip.sqsh")
    roots["pyapip"] = pip
    for name, (arch, modules) in images.items():
        root = pyxis.work / f"root-{name}"
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(containers.debian_root(arch, "python"), root, symlinks=True)
        # bookworm's interpreter, the one the modules were compiled for
        assert (root / "usr/bin/python3.11").is_file()
        containers._add_files(root, env, {f"{SITE}/{ext_name(m, arch)}": exts[arch][m]
                                          for m in modules})
        (root / SITE.lstrip("/")).chmod(0o755)
        containers.mksquashfs(root, pyxis.slurm.cluster.shared / f"{name}.sqsh")
        roots[name] = root
    yield PyImages(env=pyxis, exts=exts, roots=roots)


def _host_prediction(py: PyImages, tmp: Path) -> str:
    """What the host path predicts for the same arm64 ``ext4k`` imported by
    the same interpreter (the image's python3.11, unpacked, named by its
    host path) on a 64 KiB aarch64 node: the extension's finding there."""
    from grace_policy.check import check_step
    from grace_policy.node import NodeProfile

    site = tmp / "site"
    site.mkdir()
    shutil.copy2(py.exts["arm64"]["ext4k"], site / ext_name("ext4k", "arm64"))
    report = check_step([str(py.roots["pya4k"] / "usr/bin/python3.11"), "-c", "import ext4k"],
                        {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, str(tmp),
                        NodeProfile("aarch64", 65536, (2, 36), root_is_native=False))
    [issue] = [i for i in report.issues
               if i.rule == "page-congruence" and i.path.endswith(ext_name("ext4k", "arm64"))]
    return issue.predicted_error.replace(str(site), SITE)


def _joined(stderr: str) -> str:
    """Our lines' words, the wrapping undone (a remedy spans lines)."""
    return " ".join(line.removeprefix(PREFIX).strip() for line in stderr.splitlines()
                    if line.startswith(PREFIX))


def _srun(py: PyImages, image: str, module: str, *args: str,
          user: str = "root") -> subprocess.CompletedProcess[str]:
    return py.env.srun([*args, f"--container-image=./{image}.sqsh", "python3", "-c",
                        f"import {module}"], user=user)


@USERS
def test_extensions_in_the_image_load_on_the_ordinary_partition(pyimages: PyImages,
                                                                user: str) -> None:
    """4 KiB pages: both modules really load, in silence, judged in the image."""
    py = pyimages
    py.env.use()
    for module in ("ext4k", "ext64k"):
        before = len(py.env.slurm.audit_lines())
        res = _srun(py, "py", module, user=user)
        assert res.returncode == 0, res.stderr
        assert f"{module} loaded" in res.stdout, res.stdout
        assert PREFIX not in res.stderr, res.stderr
        [rec] = py.env.records(before)
        assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
        assert (rec["image"], rec["program"]) == (py.image("py"), "python3")


def test_amd64_python_image_on_a_64k_partition(pyimages: PyImages) -> None:
    """x86_64 with 64 KiB pages: Debian's amd64 python3 is 4 KiB-linked (as
    every amd64 distribution build is), so the step is refused for the
    interpreter, which would never start: its imports are not judged, and
    ``ext4k`` is not named. The remedy names the file inside the image."""
    py = pyimages
    py.env.use(config="grace64k")
    for module in ("ext4k", "json"):
        before = len(py.env.slurm.audit_lines())
        res = _srun(py, "py", module, "-p", "gb200sim")
        assert res.returncode != 0
        assert f"{module} loaded" not in res.stdout
        assert f"{PREFIX}ERROR page-congruence: {py.image('py')}:/usr/bin/python3\n" \
            in res.stderr, res.stderr
        assert f"what to do: /usr/bin/python3 inside {py.image('py')}" in _joined(res.stderr)
        assert "ext4k" not in res.stderr, res.stderr
        [rec] = py.env.records(before)
        assert rec["action"] == "reject" and "page-congruence" in rec["rules"]


def test_4k_extension_in_the_arm64_image_on_a_gb200_partition(pyimages: PyImages,
                                                              tmp_path: Path) -> None:
    """aarch64 with 64 KiB pages: the image's own CPython passes; ``ext4k``
    is refused in the loader's words as CPython raises them (the text the
    host path predicts for the same import), naming the image in the
    remedy; ``ext64k`` and the stdlib are not refused."""
    py = pyimages
    py.env.use(config="arm64-64k")
    inner = f"{SITE}/{ext_name('ext4k', 'arm64')}"
    res = _srun(py, "pya4k", "ext4k", "-p", "gb200sim")
    assert res.returncode != 0
    assert f"{PREFIX}ERROR page-congruence: {py.image('pya4k')}:{inner}" in res.stderr, \
        res.stderr
    predicted = f"ImportError: {inner}: ELF load command address/offset not page-aligned"
    assert predicted == _host_prediction(py, tmp_path)
    assert f"without this check: {predicted}" in _joined(res.stderr), res.stderr
    assert f"what to do: {inner} inside {py.image('pya4k')}" in _joined(res.stderr), res.stderr
    assert "/usr/bin/python3" not in res.stderr and "image-arch-mismatch" not in res.stderr
    assert "pyxis: printing enroot log file" not in res.stderr  # refused before it started
    for image, module in (("pya64k", "ext64k"), ("pya64k", "json")):
        before = len(py.env.slurm.audit_lines())
        res = _srun(py, image, module, "-p", "gb200sim")
        assert PREFIX not in res.stderr, res.stderr
        [rec] = py.env.records(before)
        assert (rec["action"], rec["rules"], rec["skipped"]) == ("allow", [], None)
        assert rec["image"] == py.image(image)
        assert ENROOT_EXEC_ERROR in res.stderr  # this x86_64 node cannot run it
    # The stdlib only, with ext4k on PYTHONPATH: the step does not import it,
    # so it runs (in enforce mode); the module that would fail if imported
    # is named as a warning, in the loader's words.
    before = len(py.env.slurm.audit_lines())
    res = _srun(py, "pya4k", "json", "-p", "gb200sim")
    assert f"{PREFIX}WARNING py-dist-broken: {py.image('pya4k')}:{inner}" in res.stderr, \
        res.stderr
    assert "ERROR" not in res.stderr
    assert (f"would fail: ImportError: {inner}: ELF load command address/offset not "
            "page-aligned") in _joined(res.stderr)
    # The remedy is the image's (not "reinstall it from a job on this partition").
    assert (f"what to do: ext4k (no package metadata) inside {py.image('pya4k')} would fail "
            "here if imported") in _joined(res.stderr), res.stderr
    [rec] = py.env.records(before)
    assert (rec["action"], rec["rules"]) == ("warn", ["py-dist-broken"])
    assert ENROOT_EXEC_ERROR in res.stderr


def test_pip_installed_4k_extension_in_the_image_on_a_gb200_partition(
        pyimages: PyImages) -> None:
    """``pip install`` in the image put ext4k (with its metadata) in
    /usr/local's dist-packages, a directory that on the host is the node's
    own Python: in the image it is the image's, and judged as such."""
    py = pyimages
    py.env.use(config="arm64-64k")
    inner = f"{PIP_SITE}/{ext_name('ext4k', 'arm64')}"
    res = _srun(py, "pyapip", "ext4k", "-p", "gb200sim")
    assert res.returncode != 0
    assert f"{PREFIX}ERROR page-congruence: {py.image('pyapip')}:{inner}" in res.stderr, \
        res.stderr
    assert (f"without this check: ImportError: {inner}: ELF load command address/offset "
            "not page-aligned") in _joined(res.stderr), res.stderr
