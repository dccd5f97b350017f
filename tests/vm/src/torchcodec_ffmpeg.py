"""The FFmpeg half of ``import torchcodec``, run for real on the node.

torchcodec's loader tries its ``libtorchcodec_core<N>.so`` newest FFmpeg
major first and keeps the first that loads; a core fails to load when one of
the FFmpeg libraries it names (DT_NEEDED) is not found the way dlopen finds
it (LD_LIBRARY_PATH, ld.so.cache, the system directories). This script does
that part: for each core of the installed torchcodec, newest first, it loads
the FFmpeg libraries the core names, in its order, with dlopen (ctypes), and
says which major loaded. The cores' other needs are a CUDA 13 torch
(libtorch_cuda.so, libcudart.so.13, libnvrtc.so.13, libnppicc.so.13: GBs),
which the test home does not hold, so the ``import torchcodec`` at the end
runs only when asked (``--import``); its presence is what makes the plugin
judge torchcodec for this step.
"""

import ctypes
import importlib.util
import os
import struct
import sys

FFMPEG = ("libavutil.", "libavcodec.", "libavformat.", "libavdevice.", "libavfilter.",
          "libswscale.", "libswresample.", "libpostproc.")


def needed(path):
    """DT_NEEDED names of a little-endian ELF64 file, from its sections."""
    with open(path, "rb") as fh:
        data = fh.read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    out = []
    for _name, kind, _f, _a, off, size, link, _i, _al, _es in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        stroff = sections[link][4]
        for pos in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", stroff + val)
                out.append(data[stroff + val:end].decode())
    return out


spec = importlib.util.find_spec("torchcodec")
if spec is None or spec.origin is None:
    sys.exit("torchcodec is not installed for this python")
pkg = os.path.dirname(spec.origin)
cores = sorted(((int(n[18:-3]), n) for n in os.listdir(pkg)
                if n.startswith("libtorchcodec_core") and n[18:-3].isdigit()), reverse=True)
for major, name in cores:
    libs = [n for n in needed(os.path.join(pkg, name)) if n.startswith(FFMPEG)]
    try:
        for lib in libs:
            ctypes.CDLL(lib)
    except OSError as exc:
        print(f"FFmpeg {major}: {exc}", file=sys.stderr)
        continue
    print(f"FFmpeg {major} loaded for {name}: {' '.join(libs)}")
    break
else:
    sys.exit(f"no FFmpeg for any of {' '.join(n for _, n in cores)}")

if "--import" in sys.argv[1:]:
    import torchcodec  # noqa: F401
