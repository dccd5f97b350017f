"""The ld.so.cache parser against ``ldconfig`` and the real loader.

Why: the cache decides where most system libraries come from; we parse it
ourselves (no subprocess at step launch), so the parse must equal what
``ldconfig -p`` prints, pick the entry the loader picks (glibc-hwcaps and,
for glibc < 2.37, legacy ``tls/``/``x86_64/``/``haswell/`` entries), and never
raise on a damaged file: the check runs inside slurmstepd.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures.build import X86_64_LOADER, ElfBuilder, parse_loader_list, src

from grace_policy import ldcache, loader
from grace_policy.node import detect, host_machine

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
SYSTEM_CACHE = Path("/etc/ld.so.cache")

pytestmark = [
    pytest.mark.skipif(host_machine() != "x86_64", reason="flag names assume x86_64"),
    pytest.mark.skipif(not Path(LDCONFIG).exists(), reason="ldconfig not installed"),
]

#: ldconfig -p's words for the flags, as in glibc's ``print_entry``.
FLAG_WORDS = {"libc6,x86-64": 0x0303, "libc6,AArch64": 0x0A03, "libc6": 0x0003}
_LINE = re.compile(r"^\t(?P<name>\S+) \((?P<flags>[^,)]+,[^,)]+|[^,)]+)"
                   r"(?:, hwcap: (?P<hwcap>[^)]*?))?(?:, OS ABI: [^)]*)?\) => (?P<path>.*)$")


def ldconfig_print(cache: Path) -> list[tuple[str, int, str, str | None]]:
    """(name, flags, path, hwcap text) per entry, in file order."""
    out = subprocess.run([LDCONFIG, "-C", str(cache), "-p"], capture_output=True, text=True,
                         check=True).stdout
    entries = []
    for line in out.splitlines()[1:]:
        if not line.startswith("\t"):
            continue
        m = _LINE.match(line)
        assert m, f"unparsed ldconfig line {line!r}"
        hwcap = m.group("hwcap")
        entries.append((m.group("name"), FLAG_WORDS[m.group("flags")], m.group("path"),
                        hwcap.strip('"') if hwcap else None))
    return entries


def ours(cache: ldcache.LdCache) -> list[tuple[str, int, str, str | None]]:
    rows = []
    for entries in cache.by_name.values():
        for e in entries:
            hw = e.hwcap_subdir if e.hwcap_subdir is not None else (
                f"0x{e.legacy_hwcap:016x}" if e.legacy_hwcap else None)
            rows.append((e.name, e.flags, e.path, hw))
    return rows


@pytest.mark.skipif(not SYSTEM_CACHE.exists(), reason="no /etc/ld.so.cache on this host")
def test_system_cache_equals_ldconfig_p() -> None:
    want = ldconfig_print(SYSTEM_CACHE)
    got = ours(ldcache.load(str(SYSTEM_CACHE)))
    assert len(want) > 50
    assert sorted(got) == sorted(want)
    # Same-name entries keep the file order glibc's tie-break depends on.
    for name in {n for n, *_ in want}:
        assert [r for r in got if r[0] == name] == [r for r in want if r[0] == name]


@pytest.fixture(scope="module")
def hwcaps_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A cache built by the real ldconfig over one directory holding libg.so
    plainly, in glibc-hwcaps/x86-64-v{2,3} and in legacy tls/, x86_64/,
    haswell/ subdirectories."""
    root = tmp_path_factory.mktemp("ldcache")
    lib = root / "lib"
    b = ElfBuilder(root)
    built = b.compile(src("libgreet.c"), "lib/libg.so", shared=True, soname="libg.so")
    for sub in ("glibc-hwcaps/x86-64-v2", "glibc-hwcaps/x86-64-v3", "tls", "x86_64",
                "haswell"):
        (lib / sub).mkdir(parents=True)
        shutil.copy(built, lib / sub / "libg.so")
    conf = root / "ld.so.conf"
    conf.write_text(f"{lib}\n")
    cache = root / "ld.so.cache"
    proc = subprocess.run([LDCONFIG, "-C", str(cache), "-f", str(conf)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0 or not cache.exists():
        pytest.skip(f"ldconfig -C/-f failed here: {proc.stderr.strip()}")
    return cache, lib


def test_hwcaps_extension_parsed_like_ldconfig(hwcaps_cache: tuple[Path, Path]) -> None:
    cache_file, _ = hwcaps_cache
    want = [r for r in ldconfig_print(cache_file) if r[0] == "libg.so"]
    if not any(r[3] and r[3].startswith("x86-64") for r in want):
        pytest.skip("this ldconfig does not write the glibc-hwcaps extension")
    got = [r for r in ours(ldcache.load(str(cache_file))) if r[0] == "libg.so"]
    assert got == want
    subdirs = {r[3] for r in got}
    assert {"x86-64-v2", "x86-64-v3"} <= subdirs


def test_lookup_priorities(hwcaps_cache: tuple[Path, Path]) -> None:
    cache_file, lib = hwcaps_cache
    cache = ldcache.load(str(cache_file))
    levels = ("x86-64-v4", "x86-64-v3", "x86-64-v2")
    assert cache.lookup("libg.so", 0x0303, levels) == f"{lib}/glibc-hwcaps/x86-64-v3/libg.so"
    assert cache.lookup("libg.so", 0x0303, ("x86-64-v2",)) == (
        f"{lib}/glibc-hwcaps/x86-64-v2/libg.so")
    # No usable level, glibc >= 2.37 (legacy ignored): the plain entry.
    assert cache.lookup("libg.so", 0x0303) == f"{lib}/libg.so"
    # glibc 2.36 on a haswell-platform CPU: tls/ is the first fitting entry.
    allowed_haswell = (ldcache.LEGACY_TLS_BIT | (0xF << 48) | 0b110, 1 << 50)
    assert cache.lookup("libg.so", 0x0303, (), allowed_haswell) == f"{lib}/tls/libg.so"
    # Another architecture's flags never match.
    assert cache.lookup("libg.so", 0x0A03, levels) is None
    assert cache.lookup("libg.so", None, levels) == f"{lib}/glibc-hwcaps/x86-64-v3/libg.so"


def _real_loader_with_cache(cache: Path, exe: Path) -> dict[str, str | None]:
    """The host loader reading ``cache`` as /etc/ld.so.cache, via a bind mount
    in a private mount namespace (nothing outside this process sees it)."""
    script = (f"mount --bind {cache} /etc/ld.so.cache && "
              f"LD_TRACE_LOADED_OBJECTS=1 {X86_64_LOADER} {exe}")
    try:
        proc = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                              text=True, timeout=30, check=False)
    except FileNotFoundError:
        pytest.skip("unshare not installed")
    if proc.returncode != 0:
        pytest.skip(f"cannot bind-mount a test cache here (needs root): {proc.stderr.strip()}")
    return parse_loader_list(proc.stdout).libs


@pytest.mark.parametrize("with_hwcaps_dirs", [True, False], ids=["glibc-hwcaps", "legacy-only"])
def test_cache_choice_matches_the_real_loader(tmp_path: Path, elf_builder: ElfBuilder,
                                              with_hwcaps_dirs: bool) -> None:
    """Model and loader read the same test cache and pick the same entry."""
    lib = tmp_path / "cachelib"
    built = elf_builder.compile(src("libgreet.c"), "cachelib/libgreet.so.1", shared=True,
                                soname="libgreet.so.1")
    subs = ["tls", "x86_64", "haswell"]
    if with_hwcaps_dirs:
        subs += ["glibc-hwcaps/x86-64-v2", "glibc-hwcaps/x86-64-v3"]
    for sub in subs:
        (lib / sub).mkdir(parents=True)
        shutil.copy(built, lib / sub / built.name)
    elf_builder.link_dev_name(built)
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{lib}\n")
    cache = tmp_path / "ld.so.cache"
    subprocess.run([LDCONFIG, "-C", str(cache), "-f", str(conf)], check=True,
                   capture_output=True)
    exe = elf_builder.compile(src("use_greet.c"), "bin/app", needed_libs=("greet",),
                              lib_dirs=(lib,))
    real = _real_loader_with_cache(cache, exe)
    node = detect()
    tree = loader.resolve(str(exe), loader.read_elf(str(exe)), node, {},
                          loader.Loading(cache=ldcache.load(str(cache)), exec_origin=False))
    assert tree.resolved()["libgreet.so.1"] == real["libgreet.so.1"]
    assert real["libgreet.so.1"] != str(built)  # a subdirectory entry won
    assert next(o.found_via for o in tree.objects if o.name == "libgreet.so.1") == "ld.so.cache"


@pytest.mark.parametrize("cut", [0, 1, 11, 16, 20, 47, 48, 60, 200, -100, -1])
def test_truncated_system_cache_never_raises(cut: int) -> None:
    data = SYSTEM_CACHE.read_bytes() if SYSTEM_CACHE.exists() else b""
    if not data:
        pytest.skip("no /etc/ld.so.cache")
    full = ldcache.parse(data)
    part = ldcache.parse(data[:cut] if cut >= 0 else data[:len(data) + cut])
    assert len(part) <= len(full)
    for entries in part.by_name.values():
        for e in entries:
            assert e in full.by_name[e.name]


def test_garbage_gives_empty_or_partial_never_exceptions() -> None:
    import random

    rng = random.Random(20240611)
    data = SYSTEM_CACHE.read_bytes() if SYSTEM_CACHE.exists() else b""
    samples = [b"", b"\0" * 100, b"glibc-ld.so.cache1.1", b"ld.so-1.7.0" + b"\xff" * 64,
               b"glibc-ld.so.cache1.1" + b"\xff" * 200]
    for _ in range(300):
        blob = bytearray(data[:4096] or b"glibc-ld.so.cache1.1" + bytes(200))
        for _ in range(rng.randint(1, 20)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        samples.append(bytes(blob))
    samples.append(bytes(rng.randrange(256) for _ in range(5000)))
    for blob in samples:
        cache = ldcache.parse(blob)
        assert isinstance(cache, ldcache.LdCache)
        cache.lookup("libc.so.6", 0x0303, ("x86-64-v2",), (1 << 63, 0))
    assert len(ldcache.parse(b"\0" * 100)) == 0
    assert len(ldcache.load("/nonexistent/ld.so.cache")) == 0
