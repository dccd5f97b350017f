"""Generate the cffi embedding source of the SPANK plugin.

Run with the interpreter the plugin embeds (``make plugin`` uses
/usr/bin/python3, with cffi from build/pydeps):

    /usr/bin/python3 spank/build_plugin.py build/

Writes ``build/spank_grace_policy_cffi.c`` (cffi's embedding glue plus
spank/grace_python.c) and ``build/grace_build.h`` (where this interpreter's
library and standard library live). The Makefile compiles them into the
plugin's Python part, ``grace_policy_py.so`` (version script
grace_policy_py.map, ``-z now -z relro -z nodelete``), which the stub
``spank_grace_policy.so`` dlopen()s in slurmstepd on a verdict-cache miss. We emit C and
compile it ourselves instead of ``ffi.compile()`` so the flags are ours and the
build does not depend on distutils/setuptools being present for that Python.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import cffi
import gen_contract  # spank/, this script's own directory

HERE = Path(__file__).resolve().parent

#: grace_policy/contract.py's constants and struct grace_step, the same text
#: build/grace_contract.h holds (cffi checks the struct's layout against it
#: when the glue is compiled), and the one C function Python calls.
CDEF = gen_contract.cdef() + """
void grace_emit(void *result, int kind, const char *text);
"""

#: The one function Python implements (grace_policy/slurm_bridge.py).
EMBEDDING_API = """
int grace_py_decide(const struct grace_step *step);
"""

#: Runs once, when the interpreter starts in slurmstepd. If the bridge cannot
#: be imported, a stand-in reports why (to slurmd's log through C, as failure
#: "python") instead of leaving cffi to print to a stderr nobody reads and
#: return 0. The package cannot be trusted then, so the failure's name is
#: written in here, from the contract, at build time.
INIT_CODE = """
from spank_grace_policy import ffi, lib
try:
    from grace_policy import slurm_bridge
    slurm_bridge.register(ffi, lib)
except BaseException as _exc:
    _why = ("cannot load grace_policy.slurm_bridge: %s: %s"
            % (type(_exc).__name__, _exc)).encode("utf-8", "replace")[:900]

    @ffi.def_extern(name="grace_py_decide", error=-1)
    def _grace_py_decide_unavailable(step):
        lib.grace_emit(step.result, lib.GRACE_EMIT_LOG, _why)
        lib.grace_emit(step.result, lib.GRACE_EMIT_FAIL, @PYTHON@)
        lib.grace_emit(step.result, lib.GRACE_EMIT_DONE, b"")
        return lib.GRACE_RC_ERROR
""".replace("@PYTHON@", repr(gen_contract.contract().FAIL_PYTHON.encode()))


def build_header() -> str:
    """Facts about the embedded interpreter, as C string macros."""
    libpython = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    facts = {
        "GRACE_LIBPYTHON": libpython,
        "GRACE_PY_HOME": sys.base_prefix,
        "GRACE_PY_EXECUTABLE": sys.executable,
        "GRACE_PY_STDLIB": sysconfig.get_paths()["stdlib"],
        "GRACE_PY_DYNLOAD": sysconfig.get_config_var("DESTSHARED"),
        "GRACE_PY_VERSION": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "GRACE_CFFI_VERSION": cffi.__version__,
    }
    lines = [f"/* Written by spank/build_plugin.py for {sys.executable}; do not edit. */"]
    for key, value in facts.items():
        if not value or '"' in value or "\\" in value:
            raise SystemExit(f"build_plugin: unusable {key}: {value!r}")
        lines.append(f'#define {key} "{value}"')
    return "\n".join(lines) + "\n"


def make_ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.embedding_api(EMBEDDING_API)
    ffi.set_source("spank_grace_policy", '#include "grace.h"\n#include "grace_python.c"\n')
    ffi.embedding_init_code(INIT_CODE)
    return ffi


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: build_plugin.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    gen_contract.check_python_side()
    header = build_header()
    target = out / "grace_build.h"
    if not target.exists() or target.read_text() != header:
        target.write_text(header)
    make_ffi().emit_c_code(str(out / "spank_grace_policy_cffi.c"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
