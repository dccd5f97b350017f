"""Where enroot 4.1.2 keeps its blobs (``enroot.in``, ``docker.sh``) and
what the check makes of a manifest it cannot look up there; the end-to-end
cases, with the real enroot and registry, are test_cli_cache.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grace_policy.registry.cache import cache_dir, look
from grace_policy.registry.manifest import Resolved
from grace_policy.registry.pull import pinned_uri
from grace_policy.registry.reference import Reference, parse

A, B, C = ("sha256:" + c * 64 for c in "abc")


@pytest.mark.parametrize("env, want", [
    ({"ENROOT_CACHE_PATH": "/scratch/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/scratch/c"),
    ({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/enroot"),
    ({"XDG_CACHE_HOME": "", "HOME": "/h"}, "/h/.cache/enroot"),  # empty: the default
    ({"HOME": "/h"}, "/h/.cache/enroot"),
])
def test_cache_dir_as_enroot_sets_it(env: dict[str, str], want: str) -> None:
    assert cache_dir(env) == want


def test_cache_dir_without_home_is_the_password_files() -> None:
    import pwd

    assert cache_dir({}) == f"{pwd.getpwuid(os.getuid()).pw_dir}/.cache/enroot"


@pytest.mark.parametrize("ref", [
    Reference("", "127.0.0.1:5000", "lab/img", "v1"),
    Reference("bob", "nvcr.io", "nvidia/pytorch", "25.01-py3"),
    Reference("", "registry-1.docker.io", "library/ubuntu", "latest"),
])
def test_the_pinned_uri_names_the_digest_as_enroot_parses_it(ref: Reference) -> None:
    assert parse(pinned_uri(ref, A)) == Reference(ref.user, ref.registry, ref.image, A)


def _resolved(layers: tuple[str, ...], diff_ids: tuple[str, ...], config: str = C
              ) -> Resolved:
    return Resolved(Reference("", "r.io", "img", "t"), (), "sha256:" + "d" * 64,
                    arch="amd64", config_digest=config, layers=layers, diff_ids=diff_ids)


def test_look_counts_distinct_layers_present(tmp_path: Path) -> None:
    (tmp_path / ("a" * 64)).write_bytes(b"x")
    (tmp_path / ("c" * 64)).write_bytes(b"x")
    held = look(_resolved((A, B, A), (A, B, A)), {"ENROOT_CACHE_PATH": str(tmp_path)})
    assert (held.layers, held.held, held.config, held.complete) == (2, 1, True, False)
    (tmp_path / ("b" * 64)).symlink_to(tmp_path / "gone")  # a name is what enroot sees
    held = look(_resolved((A, B, A), (A, B, A)), {"ENROOT_CACHE_PATH": str(tmp_path)})
    assert held.complete


@pytest.mark.parametrize("layers, diff_ids, config", [
    ((), (), C),                       # no layers
    (("sha512:" + "a" * 128,), (A,), C),  # enroot would fail its checksum
    ((A, ""), (A, B), C),              # a layer without a digest
    ((A, B), (A,), C),                 # the config does not describe the layers
    ((A,), (A,), "sha256:short"),
])
def test_a_manifest_the_cache_cannot_answer(tmp_path: Path, layers: tuple[str, ...],
                                            diff_ids: tuple[str, ...], config: str) -> None:
    held = look(_resolved(layers, diff_ids, config), {"ENROOT_CACHE_PATH": str(tmp_path)})
    assert held.unusable and not held.complete
