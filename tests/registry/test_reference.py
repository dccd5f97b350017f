"""The reference grammar as enroot 4.1.2's ``docker::_parse_uri`` reads it
(the table follows its regexes, branch by branch)."""

from __future__ import annotations

import pytest

from grace_policy.registry.reference import parse

HUB = "registry-1.docker.io"


@pytest.mark.parametrize("text, want", [
    # enroot's own form, REGISTRY#IMAGE
    ("nvcr.io#nvidia/pytorch:25.01-py3", ("", "nvcr.io", "nvidia/pytorch", "25.01-py3")),
    ("docker://ghcr.io#lab/train:v3", ("", "ghcr.io", "lab/train", "v3")),
    ("docker://bob@nvcr.io#nvidia/x", ("bob", "nvcr.io", "nvidia/x", "latest")),
    ("127.0.0.1:5000#img:tag", ("", "127.0.0.1:5000", "img", "tag")),
    ("r.io#img:t@sha256:ab12", ("", "r.io", "img", "sha256:ab12")),  # digest wins
    ("r.io#img@sha256:ab12", ("", "r.io", "img", "sha256:ab12")),
    ("$oauthtoken@nvcr.io#nvidia/x:1", ("$oauthtoken", "nvcr.io", "nvidia/x", "1")),
    # Docker's form: a registry only with a "." or a ":"
    ("ghcr.io/lab/train:v3", ("", "ghcr.io", "lab/train", "v3")),
    ("docker://127.0.0.1:5000/img", ("", "127.0.0.1:5000", "img", "latest")),
    ("lab/train:v1", ("", HUB, "lab/train", "v1")),
    ("docker://u@lab/train@sha256:ff", ("u", HUB, "lab/train", "sha256:ff")),
    # Docker Hub's library/
    ("docker://ubuntu", ("", HUB, "library/ubuntu", "latest")),
    ("ubuntu:22.04", ("", HUB, "library/ubuntu", "22.04")),
    ("img:1@sha256:abc", ("", HUB, "library/img", "sha256:abc")),
])
def test_enroot_forms(text: str, want: tuple[str, str, str, str]) -> None:
    ref = parse(text)
    assert ref is not None
    assert (ref.user, ref.registry, ref.image, ref.tag) == want


@pytest.mark.parametrize("text", [
    "/scratch/img.sqsh", "./img.sqsh", "dockerd://local:1", "", "Bad#UPPER",
    "r.io#img:bad tag", "docker://", "r.io#img:t@md5:ab", "a#b#c",
])
def test_not_a_registry_image(text: str) -> None:
    assert parse(text) is None


def test_shown_hides_the_user_and_ports_are_cut_for_credentials() -> None:
    ref = parse("alice@127.0.0.1:5000#lab/img:v1")
    assert ref is not None and ref.user == "alice"
    assert ref.shown() == "127.0.0.1:5000#lab/img:v1" and "alice" not in ref.shown()
    assert ref.host == "127.0.0.1"
