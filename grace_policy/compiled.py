"""The compiled form of the admin's config on disk, and loading it.

Validating TOML with pydantic costs ~150 ms, far too much for each step, so a
validated config is *compiled* once into a small JSON document and this
module loads that document in microseconds. The compiled form is trusted only
when it still describes the TOML on disk (same device, inode, size, mtime and
ctime) and when no ordinary user could have written it: a cache file a user
can poison would let them lower the mode of a partition.

This module sits above both :mod:`grace_policy.policy` (the frozen form) and
:mod:`grace_policy.config` (validation, imported only when no trustworthy
compiled form exists), so neither of those needs the other's loader.
"""

from __future__ import annotations

import os
import stat

from . import __version__
from . import _json as json
from .policy import DEFAULT_POLICY, ConfigError, Policy

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~4 ms to import; annotations are strings anyway
    from typing import Any

#: Bumped when the compiled document changes shape, so an old compiled file
#: is recompiled instead of misread.
COMPILED_FORMAT = 2


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def compiled_path_for(path: str, cache_dir: str | None = None) -> str:
    """Where the compiled form of ``path`` lives: next to the TOML by default
    (the admin's directory, which users cannot write), or in ``cache_dir`` under
    a name derived from the TOML's absolute path so several configs can share
    one directory."""
    if cache_dir is None:
        return path + ".compiled.json"
    import hashlib  # only with a cache_dir: keeps the default path lean

    digest = hashlib.sha256(os.path.abspath(path).encode("utf-8", "surrogateescape"))
    return os.path.join(cache_dir, f"grace-policy-{digest.hexdigest()[:20]}.json")


def _read_trusted(cache: str, toml_st: os.stat_result) -> dict[str, Any] | None:
    """The compiled document if it may be believed, else None.

    Believed only when the file is a regular file (not followed through a
    symlink), owned by root or by the TOML's owner, writable by nobody else,
    and records exactly the TOML's current identity. Whoever can write the
    TOML itself can already set any policy, so trusting its owner adds no
    power.
    """
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_uid not in (0, toml_st.st_uid):
            return None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        if st.st_size > 4 * 1024 * 1024:
            return None
        chunks = []
        remaining = st.st_size + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(b"".join(chunks))
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("format") != COMPILED_FORMAT or doc.get("version") != __version__:
        return None
    if doc.get("source_stat") != _stat_key(toml_st):
        return None
    policy = doc.get("policy")
    return policy if isinstance(policy, dict) else None


def _write_compiled(out: str, policy: Policy, toml_st: os.stat_result) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a
    document; mode 0644 because every user's step must read it."""
    doc = {
        "format": COMPILED_FORMAT,
        "version": __version__,
        "source": policy.source,
        "source_stat": _stat_key(toml_st),
        "policy": policy.to_json(),
    }
    from .atomicfile import replace  # writing happens once per config change, not per step

    replace(out, json.dumps(doc, indent=1).encode() + b"\n")


def _stat_config(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None


def _validate(path: str) -> Policy:
    from .config import load_config  # heavy (pydantic): only without a compiled form

    return load_config(path)


def load_policy(path: str | None, *, cache_dir: str | None = None) -> Policy:
    """The policy for ``path``; the default policy when ``path`` is None.

    Fast path: a trustworthy compiled form (see :func:`_read_trusted`). Slow
    path: validate the TOML with pydantic. Nothing is ever written: this runs
    inside every step (as root for root's steps), and the config's directory
    is the admin's; compiling is ``grace-policy config check --compile``
    (:func:`compile_config`). A missing or invalid file raises
    :class:`ConfigError`; the caller then follows ``on_error``.
    """
    if path is None:
        return DEFAULT_POLICY
    st = _stat_config(path)
    cache = compiled_path_for(path, cache_dir)
    doc = _read_trusted(cache, st)
    if doc is not None:
        try:
            return Policy.from_json(doc, source=path)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # damaged: validate again (the admin recompiles)
    return _validate(path)


def compile_config(path: str, out: str | None = None) -> Policy:
    """Validate ``path`` and write its compiled form to ``out`` (default: next to
    it). For ``grace-policy config check --compile``, run by the admin, so
    errors writing the file are raised, not swallowed."""
    st = _stat_config(path)
    policy = _validate(path)
    if _stat_key(_stat_config(path)) != _stat_key(st):
        raise ConfigError(f"{path}: changed while it was being validated; run again")
    try:
        _write_compiled(out or compiled_path_for(path), policy, st)
    except OSError as exc:
        raise ConfigError(f"{out or compiled_path_for(path)}: cannot write: {exc}") from None
    return policy
