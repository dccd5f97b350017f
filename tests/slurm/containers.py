"""Container runtimes and images for the container-step scenarios (issue 15).

* pyxis 0.24.0 and enroot 4.1.2 built from the pinned source tarballs in
  ``shared/third_party/`` (a copy of the project's ``shared/`` directory
  beside the clone, as CI has it; ``GRACE_THIRD_PARTY=DIR`` names another),
  with the recipe of its README, into ``~/.cache/grace-policy-tests``
  keyed by the tarballs' sha256 (and, for pyxis, by the ``spank.h`` it was
  compiled against: a plugin runs only under the Slurm it was built for).
  Never vendored: a missing or altered tarball is a skip with the reason.
* Images the tests make with ``mksquashfs`` from real Debian roots:
  :func:`debian_root` is a minimal bookworm root per architecture made by
  ``mmdebstrap --variant=extract`` (libc6 and dash with what they depend on,
  unpacked, no maintainer script run: the foreign architecture needs no
  qemu), cached and pinned by suite; the tests add ``/etc/environment`` (the
  PATH an image's ``ENV`` would give) and programs compiled here.
  runc's bundles (:func:`make_bundle`) have the same roots as ``rootfs/``.
* Smaller roots (:func:`make_root`, no longer used by test_containers): a
  static busybox from Debian (pinned by version and sha256, per
  architecture) as ``/bin/sh`` and the architecture's glibc loader and libc
  from the Debian packages on this machine.

Imports nothing from the rest of the test package but ``corpus`` and
``vm.images`` (Debian mirror and cache helpers).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import squash  # noqa: E402
from corpus import CorpusUnavailable, _cached_tree, _run, cache_root, sha256_file  # noqa: E402

REPO = _TESTS.parent

#: name -> (tarball, sha256), as shared/third_party/README.md pins them.
THIRD_PARTY: dict[str, tuple[str, str]] = {
    "pyxis": ("pyxis-0.24.0.tar.gz",
              "063653ba39125ac29796cc6079701d1ec34dd4c5baf698efacc0f36bf3619681"),
    "enroot": ("enroot-4.1.2.tar.gz",
               "817e8d551135e6f3fc311d1ee57b03fb4d30325acba732f8dea43069ca11f8d3"),
}

#: arch -> (busybox-static version, sha256): bookworm's, the same build for
#: both architectures (tests/vm/images.py pins the arm64 one too).
BUSYBOX: dict[str, tuple[str, str]] = {
    "amd64": ("1:1.35.0-4+deb12u1+b1",
              "3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744"),
    "arm64": ("1:1.35.0-4+deb12u1+b1",
              "732c9135564fc71337e0e05fb4da4d11e6c28c1834bce3e405e575afef2a52f5"),
}

#: Debian's multiarch triplet and the loader's name, per architecture.
GLIBC: dict[str, tuple[str, str, str]] = {
    # arch: (triplet, loader path inside the image, where this machine has the libs)
    "amd64": ("x86_64-linux-gnu", "lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu"),
    "arm64": ("aarch64-linux-gnu", "lib/ld-linux-aarch64.so.1", "/usr/aarch64-linux-gnu/lib"),
}


def third_party_dir() -> Path:
    """``shared/third_party`` beside the clone (or a worktree's parent's)."""
    env = os.environ.get("GRACE_THIRD_PARTY")
    if env:
        return Path(env)
    for up in (REPO.parent, *REPO.parent.parents):
        cand = up / "shared" / "third_party"
        if cand.is_dir():
            return cand
    raise CorpusUnavailable("no shared/third_party/ beside the clone (set GRACE_THIRD_PARTY)")


def tarball(name: str) -> Path:
    file, digest = THIRD_PARTY[name]
    path = third_party_dir() / file
    if not path.is_file():
        raise CorpusUnavailable(f"{path} missing")
    got = sha256_file(path)
    if got != digest:
        raise CorpusUnavailable(f"{path} has sha256 {got}, pinned {digest}")
    return path


def _untar(tar: Path, work: Path) -> Path:
    _run(["tar", "-xzf", str(tar), "-C", str(work)])
    return work / tar.name.removesuffix(".tar.gz")


def enroot_prefix() -> Path:
    """enroot 4.1.2 installed under a cached prefix (``bin/enroot`` ...)."""
    tar = tarball("enroot")
    # Built against this system's glibc and libbsd: the release roots see the
    # same test cache at the same path, and a build from sid's root once
    # reached the host's pyxis ("GLIBC_2.38 not found" in enroot-nsenter).
    system = _build_system()
    name = f"third-party/enroot-{THIRD_PARTY['enroot'][1][:16]}-{system[:12]}"
    # enroot bakes its prefix into its scripts: build for the final place,
    # install under DESTDIR, and let _cached_tree move it there.
    final = cache_root() / name / "root"

    def build(work: Path) -> Path:
        src = _untar(tar, work)
        prefix = final
        for d in ("deps/makeself", "deps/linux-headers", "deps/dist/linux/include"):
            (src / d).mkdir(parents=True, exist_ok=True)
        makeself = shutil.which("makeself")
        if makeself is None:
            raise CorpusUnavailable("makeself not installed (bash packaging/install-deps.sh)")
        shutil.copy(makeself, src / "deps/makeself/makeself.sh")
        shutil.copy("/usr/share/makeself/makeself-header.sh", src / "deps/makeself/")
        (src / "deps/linux-headers/.stamp").touch()
        common = ["make", "-C", str(src), "FORCE_GLIBC=1", f"prefix={prefix}",
                  f"sysconfdir={prefix}/etc"]
        _run(["make", "-C", str(src), "FORCE_GLIBC=1", "deps"], timeout=600)
        # glibc < 2.38 has no strlcpy/strlcat: libbsd's (README's recipe).
        _run([*common, "LDLIBS=-l:libbsd.a -l:libbsd.so.0",
              "CPPFLAGS=-D_GNU_SOURCE -include bsd/string.h"], timeout=600)
        _run([*common, f"DESTDIR={work / 'stage'}", "install"], timeout=600)
        return work / "stage" / str(final).lstrip("/")

    return _cached_tree(name, {"sha256": THIRD_PARTY["enroot"][1], "recipe": 2,
                               "system": system}, build)


def _build_system() -> str:
    """A digest of what a native build links against here: glibc's version
    and the distribution (/etc/os-release)."""
    try:
        release = Path("/etc/os-release").read_bytes()
    except OSError:
        release = b""
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    return hashlib.sha256(libc.encode() + b"\0" + release).hexdigest()


def install_enroot(dest: Path) -> Path:
    """enroot installed at ``dest`` from the cached build, for any user.

    The cache is under root's home (mode 700 here): a job of another user
    could run nothing there. enroot bakes its prefix into ``bin/enroot``
    (its config, library and sysconf paths) and the commented defaults of
    ``enroot.conf``, nowhere else (the helpers are C programs without
    paths); the copy says ``dest`` instead, as ``make install prefix=DEST``
    would. Returns ``dest``."""
    cached = enroot_prefix()
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(cached, dest, symlinks=True)
    old, new = str(cached).encode(), str(dest).encode()
    for path in (dest / "bin" / "enroot", dest / "etc" / "enroot" / "enroot.conf"):
        data = path.read_bytes()
        if old not in data:
            raise CorpusUnavailable(f"{path}: the cached prefix is not in it (enroot changed?)")
        path.write_bytes(data.replace(old, new))
    for path in (dest, *dest.rglob("*")):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return dest
def site_enroot(dest: Path) -> Path:
    """A site's install of the built enroot (:func:`install_enroot` at
    ``dest``: its configuration in ``dest/etc/enroot``, as ``make
    prefix=DEST`` would bake it), returning ``dest/bin/enroot``. An admin's
    mounts.d files then go into ``dest/etc/enroot/mounts.d``."""
    return install_enroot(dest) / "bin" / "enroot"


def site_enroot_or_skip(dest: Path) -> Path:
    """:func:`site_enroot` at ``dest`` for tests without Slurm, returning
    ``dest``; the test is skipped, with the reason, when enroot cannot be
    built here."""
    import pytest

    try:
        enroot_prefix()
    except CorpusUnavailable as exc:
        pytest.skip(f"enroot 4.1.2 not available: {exc}")
    site_enroot(dest)
    return dest


def _spank_h_digest() -> str:
    h = hashlib.sha256()
    for name in ("spank.h", "slurm_version.h"):
        path = Path("/usr/include/slurm", name)
        if path.exists():
            h.update(path.read_bytes())
    h.update(_build_system().encode())  # and the glibc it links against
    return h.hexdigest()


def pyxis_plugin() -> Path:
    """spank_pyxis.so, built against this machine's ``<slurm/spank.h>``."""
    tar = tarball("pyxis")
    spank = _spank_h_digest()

    def build(work: Path) -> Path:
        src = _untar(tar, work)
        _run(["make", "-C", str(src)], timeout=600)
        out = work / "root"
        out.mkdir()
        shutil.copy2(src / "spank_pyxis.so", out / "spank_pyxis.so")
        return out

    root = _cached_tree(f"third-party/pyxis-{THIRD_PARTY['pyxis'][1][:16]}-{spank[:16]}",
                        {"sha256": THIRD_PARTY["pyxis"][1], "spank_h": spank}, build)
    return root / "spank_pyxis.so"


def busybox(arch: str) -> Path:
    """The static busybox of ``arch`` (Debian's, pinned), unpacked and cached."""
    version, digest = BUSYBOX[arch]

    def build(work: Path) -> Path:
        from vm.images import _mirror

        lists, cache, debs = work / "lists", work / "cache", work / "debs"
        for d in (lists / "partial", cache / "archives" / "partial", debs):
            d.mkdir(parents=True)
        sources = work / "sources.list"
        sources.write_text("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                           f"{_mirror()} bookworm main\n")
        apt = ["apt-get", "-q", f"-oAPT::Architecture={arch}", f"-oAPT::Architectures={arch}",
               f"-oDir::State::Lists={lists}", f"-oDir::Cache={cache}",
               "-oDir::State::status=/dev/null", f"-oDir::Etc::SourceList={sources}",
               "-oDir::Etc::SourceParts=/nonexistent", "-oAcquire::Retries=1",
               "-oAPT::Sandbox::User=root"]
        _run([*apt, "update"], timeout=600)
        _run([*apt, "download", f"busybox-static={version}"], cwd=debs, timeout=600)
        found = list(debs.glob("busybox-static_*.deb"))
        if len(found) != 1 or sha256_file(found[0]) != digest:
            raise CorpusUnavailable(f"busybox-static {arch} {version}: not the pinned deb")
        root = work / "root"
        _run(["dpkg-deb", "-x", str(found[0]), str(root)])
        return root

    return _cached_tree(f"third-party/busybox-{arch}", {"version": version, "sha256": digest},
                        build) / "bin" / "busybox"


#: The Debian root the pyxis images are made of: what a "slim" image holds
#: below its application, and no more. Pinned by suite (bookworm: the glibc
#: 2.36 the programs compiled here were linked against, on both
#: architectures); the stamp rebuilds it when any of this changes.
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("libc6", "dash", "base-passwd")
#: Docs, manuals, messages and iconv's modules: nothing a step here needs
#: (the gconv modules are half the root: 8 of 17 MB on amd64, 20 of 28 on
#: arm64, whose files are padded to 64 KiB).
DEBIAN_EXCLUDE = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*",
                  "/usr/lib/*/gconv/*")


#: Optional package sets on top of :data:`DEBIAN_PACKAGES`, by name: each
#: is a root (and cache directory) of its own, its packages in the stamp.
#: ``python``: bookworm's CPython 3.11.2 (python3-minimal pulls
#: python3.11-minimal and libpython3.11-minimal: the interpreter and the
#: stdlib modules its own startup needs, ``json`` among them), what a
#: "python slim" image's interpreter is.
#: ``python-dev``: that CPython's headers (libpython3.11-dev), never put in
#: an image: extensions compiled against them have the image's own ABI,
#: whatever Python the machine running the tests has.
DEBIAN_EXTRAS: dict[str, tuple[str, ...]] = {
    "python": ("python3-minimal",),
    "python-dev": ("libpython3.11-dev",),
}


def debian_root(arch: str, extra: str | None = None) -> Path:
    """A minimal Debian root of ``arch`` (``amd64``/``arm64``), cached;
    with ``extra``, a separate root that also holds that
    :data:`DEBIAN_EXTRAS` set.

    ``--variant=extract`` unpacks the packages and runs none of their
    scripts, so arm64 is made on this x86_64 machine without qemu; what
    base-passwd's postinst would do (``/etc/passwd`` and ``/etc/group``
    from its masters) is done here. About 15 s and 9 MB per architecture."""
    packages = (*DEBIAN_PACKAGES, *(DEBIAN_EXTRAS[extra] if extra else ()))
    if shutil.which("mmdebstrap") is None:
        raise CorpusUnavailable("mmdebstrap not installed (bash packaging/install-deps.sh)")

    def build(work: Path) -> Path:
        from vm.images import _mirror

        target = work / "root"
        excludes = [f"--dpkgopt=path-exclude={p}" for p in DEBIAN_EXCLUDE]
        _run(["mmdebstrap", "--mode=root", "--variant=extract", f"--arch={arch}", "--quiet",
              f"--include={','.join(packages)}",
              "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", *excludes,
              DEBIAN_SUITE, str(target), _mirror()], timeout=1200)
        for name in ("passwd", "group"):
            shutil.copy2(target / "usr/share/base-passwd" / f"{name}.master",
                         target / "etc" / name)
        # mmdebstrap's device nodes: an image's /dev is empty (the runtime
        # mounts its own), and copying /dev/zero as a file never ends.
        shutil.rmtree(target / "dev")
        (target / "dev").mkdir()
        if not (target / "bin" / "sh").exists():
            raise CorpusUnavailable(f"mmdebstrap {arch}: the root has no /bin/sh")
        return target

    want = {"suite": DEBIAN_SUITE, "arch": arch, "variant": "extract",
            "packages": list(packages), "exclude": list(DEBIAN_EXCLUDE), "recipe": 2}
    name = f"debian-{DEBIAN_SUITE}-{arch}" + (f"-{extra}" if extra else "")
    return _cached_tree(name, want, build)


def make_image_root(dest: Path, arch: str, *, files: Mapping[str, Path],
                    environment: Mapping[str, str] | None = None) -> Path:
    """An image's root: a copy of :func:`debian_root`, ``/etc/environment``
    (enroot's image environment: what ``ENV PATH=...`` in a Dockerfile
    becomes on import) and ``files`` (path inside -> file, made executable)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(debian_root(arch), dest, symlinks=True, ignore=_special_files)
    _add_files(dest, environment, files)
    return dest


def _special_files(directory: str, names: list[str]) -> set[str]:
    """Device nodes, fifos, sockets: never copied (a device is read as a file)."""
    import stat

    def special(name: str) -> bool:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))

    return {n for n in names if special(n)}


def _add_files(dest: Path, environment: Mapping[str, str] | None,
               files: Mapping[str, Path] | None) -> None:
    env = dict(environment or {"PATH": "/opt/app/bin:/usr/bin:/bin"})
    (dest / "etc" / "environment").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    for inside, src in (files or {}).items():
        target = dest / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        target.chmod(0o755)


def make_root(dest: Path, arch: str, *, environment: Mapping[str, str] | None = None,
              files: Mapping[str, Path] | None = None, glibc: bool = True) -> Path:
    """A small root: busybox as /bin/sh (and its applets enroot uses), the
    arch's glibc, ``/etc/environment``, and ``files`` (path inside -> file)."""
    for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root", "usr/bin", "home"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    bb = dest / "bin" / "busybox"
    shutil.copy2(busybox(arch), bb)
    for applet in ("sh", "cat", "ls", "echo", "env", "kill", "true", "sleep", "mkdir", "id"):
        (dest / "bin" / applet).symlink_to("busybox")
    if glibc:
        triplet, loader, libs = GLIBC[arch]
        libdir = dest / "lib" / triplet
        libdir.mkdir(parents=True, exist_ok=True)
        for lib in ("libc.so.6",):
            shutil.copy2(Path(libs) / lib, libdir / lib)
        ld = dest / loader
        ld.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(libs) / Path(loader).name, ld)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                         "nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
    (dest / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    _add_files(dest, environment, files)
    return dest


def mksquashfs(root: Path, out: Path, comp: str = "lzo") -> Path:
    """``root`` as a squashfs image (enroot's own default compression, lzo)."""
    if shutil.which("mksquashfs") is None:
        raise CorpusUnavailable("mksquashfs not installed (bash packaging/install-deps.sh)")
    squash.mksquashfs(root, out, "-comp", comp, "-all-root")
    out.chmod(0o644)
    return out


def make_bundle(dest: Path, arch: str, files: Mapping[str, Path],
                environment: Mapping[str, str] | None = None) -> Path:
    """An OCI bundle: ``runc spec``'s config.json (no terminal, the image's
    PATH in process.env) and ``rootfs/`` made by :func:`make_image_root`."""
    import json

    if shutil.which("runc") is None:
        raise CorpusUnavailable("runc not installed (bash packaging/install-deps.sh)")
    dest.mkdir(parents=True, exist_ok=True)
    make_image_root(dest / "rootfs", arch, files=files, environment=environment)
    spec = dest / "config.json"
    if spec.exists():
        spec.unlink()
    subprocess.run(["runc", "spec"], cwd=dest, check=True, capture_output=True)
    config = json.loads(spec.read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/sh"]
    env = dict(environment or {"PATH": "/opt/app/bin:/usr/bin:/bin"})
    config["process"]["env"] = [f"{k}={v}" for k, v in env.items()] + ["TERM=xterm"]
    spec.write_text(json.dumps(config, indent=1))
    return dest


def oci_conf(runc_root: Path) -> str:
    """oci.conf for runc (third_party/README.md's recipe): state under
    ``runc_root``; RunTimeRun instead of create+start."""
    name = "%n.%u.%j.%s.%t"
    runc = f"runc --root {runc_root}"
    return (f'RunTimeQuery="{runc} state {name}"\n'
            f'RunTimeKill="{runc} kill -a {name}"\n'
            f'RunTimeDelete="{runc} delete --force {name}"\n'
            f'RunTimeRun="{runc} run --bundle %b {name}"\n')
