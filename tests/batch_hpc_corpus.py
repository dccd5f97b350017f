"""Job scripts HPC centres publish as examples for their users (issue 28):
Princeton Research Computing, OLCF (Frontier), CSC (Puhti, Mahti), LUMI
and USC CARC, from their public GitHub repositories under the MIT, CC BY 4.0
and CC0 1.0 licences.

Where the files come from: ``shared/third_party/hpc-batch-scripts-1.tar.gz``
(the project's ``shared/`` beside the clone, as CI has it; ``GRACE_THIRD_PARTY``
names another directory), pinned by sha256 here and unpacked once under
``~/.cache/grace-policy-tests``. The tarball holds each script byte for
byte as its repository has it at the pinned commit, the repositories'
licence texts and a NOTICE; ``batch_hpc_corpus.toml`` (this directory) says
for each file its repository, path, commit, URL, licence and sha256, and
what the reader is expected to make of it. Never committed: they are
downloaded files.

The *foreign world* (:func:`foreign_world`) makes every command a script
could name exist, as an aarch64 program on this x86_64 machine: under each
word of the scripts in a directory first on PATH, and under each ``./NAME``
in the working directory. Whatever the reader judges as run then shows as
a finding (an error on the main path, else a warning), and whatever it
judges as not run shows as nothing, so a reader that starts judging
``command -v X`` as running X, or loses its place in a script, changes
what the test sees.

``python3 tests/batch_hpc_corpus.py`` prints what the reader makes of each
script now (to review when the reader changes on purpose).
"""

from __future__ import annotations

import os
import re
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

import tomllib

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from corpus import CorpusUnavailable, _cached_tree, sha256_file  # noqa: E402

TARBALL = "hpc-batch-scripts-1.tar.gz"
TARBALL_SHA256 = "94b1e8b919920ab583ae89a1a2eaa1a32d765dfbfeee2c985fe57bbe0bc7fef0"
TOP = "hpc-batch-scripts-1"
MANIFEST = _TESTS / "batch_hpc_corpus.toml"

#: A word a script could run as a command, and a ``./NAME`` it could start.
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.+-]{0,63}")
_HERE = re.compile(r"(?<![\w./])\./([A-Za-z0-9_][A-Za-z0-9_.+-]{0,63})")


def manifest() -> dict[str, object]:
    with open(MANIFEST, "rb") as fh:
        return tomllib.load(fh)


def _third_party() -> Path:
    from slurm.containers import third_party_dir

    return third_party_dir()


def corpus_dir() -> Path:
    """The unpacked tree (``scripts/``, ``licences/``, ``NOTICE``)."""
    tar = _third_party() / TARBALL
    if not tar.is_file():
        raise CorpusUnavailable(f"{tar} missing (shared/third_party/README.md lists it)")
    got = sha256_file(tar)
    if got != TARBALL_SHA256:
        raise CorpusUnavailable(f"{tar} has sha256 {got}, pinned {TARBALL_SHA256}")

    def build(work: Path) -> Path:
        with tarfile.open(tar) as handle:
            handle.extractall(work, filter="data")
        return work / TOP

    return _cached_tree("hpc-batch-scripts", {"sha256": TARBALL_SHA256, "layout": 1}, build)


def words(texts: Iterable[str]) -> tuple[set[str], set[str]]:
    """(every word a script's text could run, every ``./NAME`` it names)."""
    names: set[str] = set()
    here: set[str] = set()
    for text in texts:
        names.update(_WORD.findall(text))
        here.update(_HERE.findall(text))
    return names, here


def foreign_world(root: Path, texts: Iterable[str], foreign: Path) -> tuple[Path, Path]:
    """(a directory holding ``foreign`` under every word of ``texts``, a
    working directory holding it under every ``./NAME``): hard links, one
    file."""
    names, here = words(texts)
    fbin, work = root / "fbin", root / "work"
    for directory, wanted in ((fbin, names), (work, here)):
        directory.mkdir(parents=True, exist_ok=True)
        for name in sorted(wanted):
            target = directory / name
            if not target.exists():
                os.link(foreign, target)
    return fbin, work


def _print_observed() -> None:  # pragma: no cover - a maintainer's tool
    """What the reader makes of each script now, as manifest entries (TOML:
    a JSON string is a TOML basic string)."""
    import json
    import subprocess
    import tempfile

    from test_batch_hpc_corpus import observe

    tree = corpus_dir()
    with tempfile.TemporaryDirectory() as tmp:
        foreign = Path(tmp) / "foreign"
        src = Path(tmp) / "p.c"
        src.write_text("int main(void) { return 0; }\n")
        subprocess.run(["aarch64-linux-gnu-gcc", "-o", str(foreign), str(src)], check=True)
        files = sorted((tree / "scripts").iterdir())
        fbin, work = foreign_world(Path(tmp), (f.read_text("utf-8", "replace") for f in files),
                                   foreign)
        for path in files:
            seen = observe(path, fbin, work)
            print(f"[script.{json.dumps(path.name)}]")
            for key, val in seen.items():
                if isinstance(val, list):
                    val = "[" + ", ".join(json.dumps(v) for v in val) + "]"
                else:
                    val = json.dumps(val)
                print(f"{key} = {val}")
            print()


if __name__ == "__main__":  # pragma: no cover
    _print_observed()
