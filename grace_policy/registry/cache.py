"""``check --image REGISTRY#IMAGE`` without ``--pull``: the image's files,
judged from the user's enroot cache when it already holds every layer of
the manifest the check resolved for the node.

Where enroot keeps what it pulled (enroot 4.1.2 ``docker.sh``,
``docker::_download`` and ``_download_extract``): ``$ENROOT_CACHE_PATH``
(default ``${XDG_CACHE_HOME:-$HOME/.cache}/enroot``; a value in the
environment wins over ``enroot.conf``), one file per blob, named by the
hex of its ``sha256:`` digest: the image config as the zstd of its JSON,
and each layer re-compressed, the zstd of its *uncompressed* tar (a zstd
layer is kept as fetched), mode 0640. enroot decides by name alone: a blob
is fetched only when no file of that name exists (``ls`` of the directory,
``[ -e ]``), and a cached file is never checked again, so a truncated or
foreign file is used as it is (the import fails, or imports other files).

How the files are judged: by the same ``enroot import`` as ``--pull``
(:mod:`.pull`), so whiteouts, layer order and the config's environment and
entrypoint are enroot's, not those of a second image builder of ours to
keep in step with it. Three things make "judged from your cache" true when
the output says it:

* the import names the manifest by the digest the manifest check judged
  (``REGISTRY#IMAGE@sha256:...``), not the tag, which may have moved;
* before it, each cache entry is checked against the image: a regular file
  (not a symlink: enroot's ``zstd -d`` of the config skips one, and a link
  may point anywhere), whose decompressed bytes hash to the config's digest
  or to the layer's ``diff_id`` in that config (the config was checked
  against its digest by the manifest check);
* enroot runs with ``ENROOT_CACHE_PATH`` set to a private directory in the
  scratch dir: a copy of the checked config, a symlink to each checked
  layer, nothing else. If enroot fetched a blob all the same (a registry
  that answers the digest with other layers), the new file is seen there
  and the cache answer is dropped. The user's cache is never written.

A cache that cannot be used (some layers missing, an entry that fails a
check, no ``zstd`` or ``enroot``, the import failing) leaves the manifest
answer, with one line saying why and that ``--pull`` would judge the files.

Cost, paid only when every layer is cached: one decompression of each
layer to check it, then enroot's own extraction and ``mksquashfs`` into
``$TMPDIR`` (as much space as the image): seconds for a small image,
minutes for a CUDA one, and no layer crosses the network. Never used by
the plugin.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping

from .._record import dataclass
from .manifest import Resolved
from .pull import PULL_TIMEOUT, Pulled, PullError, enroot_import, pinned_uri

#: The most of a cached config read (the config itself is capped at 4 MiB).
MAX_CONFIG = 16 * 1024 * 1024
_CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")


class CacheError(Exception):
    """The cache cannot give the image's files: the reason is for the user."""


@dataclass(frozen=True)
class Holding:
    """What the user's enroot cache holds of one manifest (by name only)."""

    #: The cache directory.
    path: str
    #: Distinct layers of the manifest, and how many have an entry there.
    layers: int
    held: int
    #: Whether the config has an entry.
    config: bool
    #: Why the manifest cannot be looked up in a cache at all ("" if it can).
    unusable: str = ""

    @property
    def complete(self) -> bool:
        return not self.unusable and self.config and self.layers > 0 \
            and self.held == self.layers

    def to_json(self) -> dict[str, object]:
        """``registry.cache`` of ``check --image --json``."""
        return {"path": self.path, "layers": self.layers, "held": self.held}


def cache_dir(env: Mapping[str, str]) -> str:
    """``$ENROOT_CACHE_PATH`` as enroot 4.1.2 sets it (``enroot.in``):
    given, else ``$XDG_CACHE_HOME/enroot``, else ``$HOME/.cache/enroot``
    (``$HOME``, else the user's home from the password file)."""
    given = env.get("ENROOT_CACHE_PATH", "")
    if given:
        return given
    xdg = env.get("XDG_CACHE_HOME", "")
    if not xdg:
        home = env.get("HOME", "")
        if not home:
            try:
                import pwd

                home = pwd.getpwuid(os.getuid()).pw_dir
            except (KeyError, ImportError):
                home = ""
        xdg = f"{home}/.cache"
    return f"{xdg}/enroot"


def _name(digest: str) -> str | None:
    """The cache file name enroot gives a ``sha256:`` digest, or None for
    another form (enroot would fail its checksum on it)."""
    hexpart = digest[7:] if digest.startswith("sha256:") else ""
    return hexpart if len(hexpart) == 64 and set(hexpart) <= _HEX else None


def look(found: Resolved, env: Mapping[str, str]) -> Holding:
    """Which of ``found``'s blobs have an entry in the cache ``env`` names.
    Never raises: an unreadable directory holds nothing."""
    path = cache_dir(env)
    names = [_name(d) for d in found.layers]
    config = _name(found.config_digest)
    distinct = sorted({n for n in names if n})
    if not found.layers or config is None or None in names:
        return Holding(path, len(distinct), 0, False,
                       unusable="its manifest names a blob that is not sha256 (or no layers)")
    if len(found.diff_ids) != len(found.layers):
        return Holding(path, len(distinct), 0, False,
                       unusable="its config's diff_ids do not match its layers")
    held = sum(1 for n in distinct if _exists(os.path.join(path, n)))
    return Holding(path, len(distinct), held, _exists(os.path.join(path, config)))


def _exists(path: str) -> bool:
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True


def import_cached(found: Resolved, machine: str, env: Mapping[str, str],
                  holding: Holding) -> Pulled:
    """The image's squashfs, written by ``enroot import`` from the cache
    ``holding`` names (complete), every entry checked first. Raises
    :class:`CacheError`."""
    search = env.get("PATH", os.defpath)
    zstd = shutil.which("zstd", path=search)
    if zstd is None:
        raise CacheError("zstd is not on PATH (enroot needs it to read its cache)")
    if shutil.which("enroot", path=search) is None:
        raise CacheError("enroot is not on PATH here")
    deadline = time.monotonic() + PULL_TIMEOUT
    try:
        scratch = tempfile.mkdtemp(prefix="grace-cache-")
    except OSError as exc:
        raise CacheError(f"no scratch directory for the import ({exc.strerror or exc})"
                         ) from None
    private = os.path.join(scratch, "cache")
    try:
        os.mkdir(private, 0o700)
        tokens = f".tokens.{os.geteuid()}"
        os.mkdir(os.path.join(private, tokens), 0o700)
        ours = {tokens, *_fill(private, found, holding.path, zstd, deadline)}
        os.chmod(private, 0o500)  # a download would fail to write (not as root)
        try:
            pulled = enroot_import(pinned_uri(found.reference, found.digest), machine,
                                   {**env, "ENROOT_CACHE_PATH": private}, scratch=scratch)
        finally:
            os.chmod(private, 0o700)
        fetched = set(os.listdir(private)) - ours
    except PullError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise CacheError(f"enroot could not import it from the cache: {exc}") from None
    except OSError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise CacheError(f"cannot prepare the import ({exc.strerror or exc})") from None
    except CacheError:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if fetched:
        pulled.remove()
        raise CacheError(f"enroot fetched {len(fetched)} blob(s) the cache did not hold "
                         f"(the registry's answer for {found.digest} named other layers)")
    return pulled


def _fill(private: str, found: Resolved, cache: str, zstd: str,
          deadline: float) -> list[str]:
    """Put the checked config and links to the checked layers into
    ``private``; the names put there. Raises CacheError naming the entry."""
    config = _name(found.config_digest) or ""
    data = _read_config(os.path.join(cache, config))
    if _unzstd_digest(zstd, data, deadline) != found.config_digest:
        raise CacheError(f"cached config {config[:12]} is not this image's config "
                         "(truncated, damaged or other bytes)")
    fd = os.open(os.path.join(private, config), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    names = [config]
    for digest, diff_id in zip(found.layers, found.diff_ids):
        name = _name(digest) or ""
        if name in names:
            continue
        source = os.path.join(cache, name)
        why = _check_layer(source, zstd, diff_id, deadline)
        if why:
            raise CacheError(f"cached layer {name[:12]} {why}")
        os.symlink(source, os.path.join(private, name))
        names.append(name)
    return names


class _Odd(Exception):
    """A cache entry that is not a readable regular file: what it is."""


def _open_entry(path: str) -> tuple[int, os.stat_result]:
    """A cache entry opened without following a symlink or blocking on a
    FIFO. Raises :class:`_Odd` for anything but a readable regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                     | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Odd("is a symbolic link") from None
        raise _Odd(f"cannot be read ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _Odd("is not a regular file")
    return fd, st


def _read_config(path: str) -> bytes:
    try:
        fd, st = _open_entry(path)
    except _Odd as exc:
        raise CacheError(f"cached config {os.path.basename(path)[:12]} {exc}") from None
    try:
        if st.st_size > MAX_CONFIG:
            raise CacheError("the cached config is larger than an image config can be")
        return os.pread(fd, MAX_CONFIG + 1, 0)
    finally:
        os.close(fd)


def _unzstd_digest(zstd: str, data: bytes, deadline: float) -> str:
    """``sha256:`` of ``data`` decompressed, or "" when zstd refuses it."""
    try:
        done = subprocess.run([zstd, "-dcq"], input=data, capture_output=True, check=False,
                              timeout=max(1.0, deadline - time.monotonic()))
    except (subprocess.TimeoutExpired, OSError):
        return ""
    if done.returncode != 0:
        return ""
    return "sha256:" + hashlib.sha256(done.stdout).hexdigest()


def _check_layer(path: str, zstd: str, diff_id: str, deadline: float) -> str:
    """"" when the entry at ``path`` is a regular file whose decompressed
    bytes hash to ``diff_id``; else what is wrong (for the note)."""
    try:
        fd, _ = _open_entry(path)
    except _Odd as exc:
        return str(exc)
    digest = hashlib.sha256()
    try:
        proc = subprocess.Popen([zstd, "-dcq"], stdin=fd, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
    except OSError as exc:
        os.close(fd)
        return f"cannot be checked (zstd: {exc.strerror})"
    os.close(fd)
    late = False
    out = proc.stdout
    with out:  # type: ignore[union-attr]
        while chunk := out.read(_CHUNK):  # type: ignore[union-attr]
            digest.update(chunk)
            if time.monotonic() > deadline:
                late = True
                proc.kill()
                break
    code = proc.wait()
    if late:
        return f"took more than {PULL_TIMEOUT:.0f} s to check"
    if code != 0:
        return "is not a whole zstd stream (truncated or damaged)"
    if "sha256:" + digest.hexdigest() != diff_id:
        return "holds other files than this image's layer (its diff_id differs)"
    return ""
