"""Debian's real ``docker-registry`` (distribution 2.8.2) on 127.0.0.1, and
images the tests write as OCI layouts and push with ``skopeo``.

Images (field notes §12): Docker schema 2 (``skopeo copy --format v2s2``;
enroot first asks with a ``HEAD`` without ``Accept`` and 2.8.2 answers 404
for an OCI manifest), a config with a non-empty ``history``; a
multi-platform image is a hand-written index blob named from the layout's
``index.json``, pushed with ``--all`` (then a Docker manifest list).

A layer is a gzip tar of a root directory the caller gives (for the
Slurm scenarios: a Debian root of that architecture), or of a few small
files (the unit tests: the check reads no layer).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

PLATFORM = {"x86_64": "amd64", "aarch64": "arm64", "amd64": "amd64", "arm64": "arm64",
            "s390x": "s390x", "ppc64le": "ppc64le"}


def need_tools() -> None:
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (bash packaging/install-deps.sh)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # type: ignore[no-any-return]


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash as registry 2.8.2's htpasswd wants it, cost 4 (the
    registry checks it on every request): Debian's python3-bcrypt, else
    Python's crypt (gone in 3.13)."""
    try:
        import bcrypt

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()  # type: ignore[no-any-return]
    except ImportError:
        pass
    try:
        import crypt
    except ImportError:
        pytest.skip("neither bcrypt (python3-bcrypt) nor crypt to write an htpasswd")
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


class LocalRegistry:
    """One registry process: storage, config and log under ``work``."""

    def __init__(self, work: Path, *, users: Mapping[str, str] | None = None) -> None:
        need_tools()
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = work / "registry.log"
        self.users = dict(users or {})
        auth = ""
        if self.users:
            with (work / "htpasswd").open("w") as fh:
                for user, password in self.users.items():
                    fh.write(f"{user}:{bcrypt_hash(password)}\n")
            auth = (f"auth:\n  htpasswd:\n    realm: grace-tests\n"
                    f"    path: {work / 'htpasswd'}\n")
        (work / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {work / 'storage'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n{auth}")
        self._fh = self.log.open("wb")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(work / "config.yml")],
                                     stdout=self._fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("docker-registry did not listen within 30 s")

    def push(self, layout: Path, tag: str, name: str, *, multi: bool = False) -> None:
        cmd = ["skopeo", "--insecure-policy", "copy", "--format", "v2s2",
               "--dest-tls-verify=false"]
        if self.users:
            user, password = next(iter(self.users.items()))
            cmd += ["--dest-creds", f"{user}:{password}"]
        if multi:
            cmd.append("--all")
        cmd += [f"oci:{layout}:{tag}", f"docker://{self.address}/{name}:{tag}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"skopeo failed: {proc.stderr[-2000:]}")

    def mark(self) -> int:
        """Where the log ends now (for :meth:`blob_gets` since then)."""
        return self.log.stat().st_size

    def blob_gets(self, since: int = 0) -> list[str]:
        """The blob paths GET (a pull, not skopeo's push checks) asked for
        since ``since``, from the registry's access log."""
        with self.log.open("rb") as fh:
            fh.seek(since)
            text = fh.read().decode(errors="replace")
        out = []
        for line in text.splitlines():
            if '"GET /v2/' in line and "/blobs/sha256:" in line:
                out.append(line.split('"GET ', 1)[1].split()[0])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._fh.close()


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return "sha256:" + digest, len(data)


def _layer(root: Path | None, files: Mapping[str, bytes]) -> tuple[bytes, str]:
    """(gzip tar, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if root is not None:
            for entry in sorted(os.listdir(root)):
                tar.add(root / entry, arcname=entry)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    plain = raw.getvalue()
    return gzip.compress(plain, mtime=0), "sha256:" + hashlib.sha256(plain).hexdigest()


def _manifest(layout: Path, arch: str, root: Path | None, files: Mapping[str, bytes],
              env: list[str], more: Sequence[Mapping[str, bytes]] = ()) -> dict[str, object]:
    layer, diff_id = _layer(root, files)
    layer_digest, layer_size = _blob(layout, layer)
    layers = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
               "digest": layer_digest, "size": layer_size}]
    diff_ids = [diff_id]
    for extra in more:
        data, extra_id = _layer(None, extra)
        digest, size = _blob(layout, data)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": digest, "size": size})
        diff_ids.append(extra_id)
    config = {
        "architecture": PLATFORM[arch], "os": "linux",
        "config": {"Env": env, "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "grace-policy tests"}] * len(layers),
    }
    config_digest, config_size = _blob(layout, json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": layers,
    }
    digest, size = _blob(layout, json.dumps(manifest).encode())
    return {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
            "size": size, "platform": {"architecture": PLATFORM[arch], "os": "linux"},
            "layer": layer_digest}


def oci_image(layout: Path, tag: str, arches: Mapping[str, Path | None], *,
              files: Mapping[str, bytes] | None = None,
              env: list[str] | None = None,
              more: Sequence[Mapping[str, bytes]] = ()) -> dict[str, str]:
    """An OCI layout with ``tag``: one manifest when ``arches`` has one
    entry, else an index of one manifest per architecture (in the given
    order). ``arches``: architecture -> root directory to pack (or None);
    ``more``: the files of further layers, each a layer of its own.
    Returns architecture -> the digest of its (first) layer (what a pull
    fetches)."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    env = env if env is not None else ["PATH=/usr/bin:/bin"]
    entries = [_manifest(layout, arch, root, files or {"etc/hostname": arch.encode()}, env,
                         more) for arch, root in arches.items()]
    layers = {arch: str(e.pop("layer")) for arch, e in zip(arches, entries)}
    if len(entries) == 1:
        top = dict(entries[0])
        top.pop("platform")
    else:
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": entries}
        digest, size = _blob(layout, json.dumps(index).encode())
        top = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest,
               "size": size}
    index_path = layout / "index.json"
    old = json.loads(index_path.read_text()) if index_path.exists() else {
        "schemaVersion": 2, "manifests": []}
    top["annotations"] = {"org.opencontainers.image.ref.name": tag}
    old["manifests"] = [m for m in old["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                        != tag] + [top]
    index_path.write_text(json.dumps(old))
    return layers


def single_manifest(layout: Path, tag: str) -> tuple[str, dict[str, object]]:
    """(digest, manifest) of a one-platform ``tag`` in the layout, as the
    registry serves it after the push (skopeo's v2s2 conversion keeps the
    layer and config digests, not the manifest's: the caller asks the
    registry for that)."""
    index = json.loads((layout / "index.json").read_text())
    for entry in index["manifests"]:
        if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            digest = entry["digest"]
            blob = layout / "blobs" / "sha256" / digest.split(":", 1)[1]
            return digest, json.loads(blob.read_text())
    raise KeyError(tag)
