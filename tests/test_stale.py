"""The node checker's staleness stamp (grace_policy/checker/stale.py) covers
the whole installed package, not only the modules the server imported: an
upgrade that replaces a module it had not loaded yet (``image/``) would
otherwise mix old and new code. The real server on a real Slurm:
tests/slurm/test_nodecheck.py::test_replaced_module_not_loaded_ends_the_server."""

from __future__ import annotations

import os
from pathlib import Path

from grace_policy.checker import stale


def _tree(root: Path) -> Path:
    pkg = root / "grace_policy"
    (pkg / "image").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "decide.py").write_text("x = 1\n")
    (pkg / "image" / "sif.py").write_text("y = 1\n")
    return pkg


def test_replacing_a_module_the_server_never_loaded_is_stale(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    install = stale.Install([str(pkg / "decide.py")], [str(pkg)])
    assert install.changed() is None
    sif = pkg / "image" / "sif.py"
    data = sif.read_bytes()
    sif.unlink()  # as an installer replaces it: a new file, a new inode
    sif.write_bytes(data)
    why = install.changed()
    assert why is not None and "image" in why


def test_a_new_module_is_stale_and_bytecode_beside_it_is_not(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    install = stale.Install([], [str(pkg)])
    cache = pkg / "image" / "__pycache__"
    cache.mkdir()  # root running the CLI, say, compiles what it imports
    (cache / "sif.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert install.changed() is None
    (pkg / "image" / "new.py").write_text("z = 1\n")
    assert install.changed() is not None


def test_the_stamp_is_of_the_running_package() -> None:
    assert os.path.isfile(os.path.join(stale.PACKAGE, "checker", "stale.py"))
