"""The registry check against Debian's real ``docker-registry`` 2.8.2, with
images pushed by ``skopeo`` (tests/registry/local_registry.py), and against
servers that misbehave on purpose (a registry cannot be made to).

What each case checks: enroot's choice (list entry for the node, else the
single manifest, and its config's architecture), the verdict the plugin's
core draws from it, that no layer is ever asked for, that every failure
ends within the check's deadline as an ``on_error`` verdict, and that no
credential shows in any verdict, message or log line.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_registry import LocalRegistry, oci_image

from grace_policy._record import replace
from grace_policy.budget import Budget, BudgetExceeded
from grace_policy.decide import StepRequest, decide
from grace_policy.node import detect
from grace_policy.policy import Policy
from grace_policy.registry import RegistryError
from grace_policy.registry.manifest import resolve
from grace_policy.registry.reference import parse
from grace_policy.registry.settings import Settings
from grace_policy.registry.step import RegistryStep

HTTP = Settings(allow_http=True)
TAGS = {"amd": {"x86_64": None}, "arm": {"aarch64": None},
        "both": {"x86_64": None, "aarch64": None}, "armlist": {"aarch64": None, "s390x": None}}


@pytest.fixture(scope="module")
def anon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRegistry, dict]]:
    work = tmp_path_factory.mktemp("registry")
    reg = LocalRegistry(work / "reg")
    layers: dict[str, dict[str, str]] = {}
    try:
        for tag, arches in TAGS.items():
            layers[tag] = oci_image(work / "layout", tag, arches,
                                    files={"etc/image-tag": tag.encode()})
            reg.push(work / "layout", tag, "lab/img", multi=len(arches) > 1)
        yield reg, layers
    finally:
        reg.stop()


def _node(machine: str):  # type: ignore[no-untyped-def]
    return replace(detect(), machine=machine)


def _step(text: str, settings: Settings = HTTP) -> RegistryStep:
    ref = parse(text)
    assert ref is not None
    return RegistryStep(ref, settings, text)


def _decide(step: RegistryStep, machine: str, **policy: object):  # type: ignore[no-untyped-def]
    return decide(Policy(mode="enforce", **policy), StepRequest(partition=None, argv=["/bin/sh"],
                                                                env={}, cwd="/",
                                                                node=_node(machine), registry=step))  # type: ignore[arg-type]


@pytest.mark.parametrize("tag, machine, arch, platforms", [
    ("amd", "x86_64", "amd64", ()),
    ("arm", "x86_64", "arm64", ()),
    ("both", "x86_64", "amd64", ("linux/amd64", "linux/arm64")),
    ("both", "aarch64", "arm64", ("linux/amd64", "linux/arm64")),
    ("armlist", "aarch64", "arm64", ("linux/arm64", "linux/s390x")),
    ("armlist", "x86_64", "", ("linux/arm64", "linux/s390x")),  # no entry for the node
])
def test_enroot_choice(anon, tag: str, machine: str, arch: str,  # type: ignore[no-untyped-def]
                       platforms: tuple[str, ...]) -> None:
    reg, _ = anon
    found = resolve(parse(f"{reg.address}#lab/img:{tag}"), machine, HTTP,  # type: ignore[arg-type]
                    Budget(5000))
    assert (found.arch, found.platforms) == (arch, platforms)
    assert found.digest.startswith("sha256:") == bool(arch)


def test_verdicts_and_no_layer_fetched(anon) -> None:  # type: ignore[no-untyped-def]
    reg, layers = anon
    mark = reg.mark()
    for tag, machine, action in [("amd", "x86_64", "allow"), ("arm", "x86_64", "reject"),
                                 ("both", "x86_64", "allow"), ("both", "aarch64", "allow"),
                                 ("amd", "aarch64", "reject"), ("armlist", "x86_64", "reject")]:
        verdict = _decide(_step(f"{reg.address}#lab/img:{tag}"), machine)
        assert verdict.action == action, (tag, machine, verdict)
        assert verdict.error is None
        if action == "reject":
            (finding,) = verdict.findings
            assert finding.rule == "image-arch-mismatch"
            assert f"{reg.address}#lab/img:{tag}" in finding.path
            assert "these nodes are linux/" in finding.remediation
        else:
            assert "judged after the pull" in str(verdict.skipped)
    asked = " ".join(reg.blob_gets(mark))
    assert asked, "the configs were read from the registry"  # the log is the right one
    for per_tag in layers.values():
        for layer in per_tag.values():
            assert layer.split(":")[1] not in asked, "a layer was fetched"


def test_message_names_platforms(anon) -> None:  # type: ignore[no-untyped-def]
    reg, _ = anon
    (finding,) = _decide(_step(f"docker://{reg.address}/lab/img:armlist"), "x86_64").findings
    assert "linux/arm64, linux/s390x" in finding.remediation
    assert "linux/amd64" in finding.remediation


def test_missing_tag_and_https_to_http_follow_on_error(anon) -> None:  # type: ignore[no-untyped-def]
    reg, _ = anon
    for on_error, action in (("allow", "allow"), ("deny", "reject")):
        verdict = _decide(_step(f"{reg.address}#lab/img:nope"), "x86_64", on_error=on_error)
        assert verdict.action == action and "HTTP 404" in str(verdict.error)
    # Without ENROOT_ALLOW_HTTP enroot speaks TLS: this registry does not.
    verdict = _decide(_step(f"{reg.address}#lab/img:amd", Settings()), "x86_64",
                      on_error="deny")
    assert verdict.action == "reject" and "TLS" in str(verdict.error)


# -- credentials -----------------------------------------------------------

PASSWORD = "Zq8-correct-horse"


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    work = tmp_path_factory.mktemp("private")
    reg = LocalRegistry(work / "reg", users={"alice": PASSWORD})
    try:
        oci_image(work / "layout", "arm", {"aarch64": None})
        reg.push(work / "layout", "arm", "team/img")
        yield reg
    finally:
        reg.stop()


def _with_credentials(tmp: Path, line: str, env: dict[str, str]) -> Settings:
    config = tmp / "enroot"
    config.mkdir(exist_ok=True)
    (config / ".credentials").write_text(line)
    return Settings(allow_http=True, config_path=str(config), env=env)


def test_basic_auth_with_credentials_file(private: LocalRegistry, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    good = _with_credentials(tmp_path, "machine 127.0.0.1 login alice password $REG_PW\n",
                             {"REG_PW": PASSWORD})
    text = f"{private.address}#team/img:arm"
    # No USER@: enroot 4.1.2 takes alice from .credentials.
    verdict = _decide(_step(text, good), "x86_64")
    assert verdict.action == "reject" and verdict.findings[0].rule == "image-arch-mismatch"
    verdict = _decide(_step(f"alice@{text}", good), "x86_64")
    assert verdict.action == "reject"
    anonymous = _decide(_step(text), "x86_64", on_error="deny")
    assert anonymous.action == "reject" and "HTTP 401" in str(anonymous.error)
    bad = _with_credentials(tmp_path, "machine 127.0.0.1 login alice password wrong-Pw9\n", {})
    refused = _decide(_step(text, bad), "x86_64", on_error="allow")
    assert refused.action == "allow" and "HTTP 401" in str(refused.error)
    shown = json.dumps([v.to_json() for v in (verdict, anonymous, refused)])
    shown += repr((good, bad)) + "".join(capsys.readouterr())
    for secret in (PASSWORD, "wrong-Pw9", "YWxpY2U6"):  # base64 of "alice:" starts so
        assert secret not in shown
        assert secret not in private.log.read_text()


# -- faults ---------------------------------------------------------------


class Fault:
    """A listener on 127.0.0.1 that answers every connection with ``handler``."""

    def __init__(self, handler) -> None:  # type: ignore[no-untyped-def]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.handler = handler
        self.conns: list[socket.socket] = []
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            self.handler(conn)
        except OSError:
            pass

    def close(self) -> None:
        self.stopped = True
        self.sock.close()
        for conn in self.conns:
            conn.close()


def _never(conn: socket.socket) -> None:
    time.sleep(30)


def _status_500(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno")


def _huge_manifest(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.distribution."
                 b"manifest.v2+json\r\n\r\n")  # no length: until close, 100 MB
    chunk = b" " * 65536
    for _ in range(100 * 16):
        conn.sendall(chunk)


def _declared_huge(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n{")
    time.sleep(5)


def _drip(conn: socket.socket) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
        conn.sendall(bytes([byte]))
        time.sleep(0.05)


def _big_index(conn: socket.socket) -> None:
    entries = [{"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "digest": "sha256:" + f"{i:064x}", "size": 1,
                "platform": {"architecture": "s390x", "os": "linux"}} for i in range(10000)]
    body = json.dumps({"schemaVersion": 2, "manifests": entries}).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("handler, says", [
    (_never, "did not answer within the check's deadline"),
    (_status_500, "HTTP 500"),
    (_huge_manifest, "bytes this check reads"),
    (_declared_huge, "104857600 bytes"),
    (_drip, "deadline"),
    (_big_index, "10000 entries"),
])
@pytest.mark.parametrize("on_error, action", [("deny", "reject"), ("allow", "allow")])
def test_faults_end_within_the_deadline(handler, says: str, on_error: str,  # type: ignore[no-untyped-def]
                                        action: str) -> None:
    from grace_policy.policy import Limits

    fault = Fault(handler)
    try:
        started = time.monotonic()
        verdict = _decide(_step(f"{fault.address}#lab/img:v1"), "x86_64",
                          on_error=on_error, limits=Limits(deadline_ms=1500))
        took = time.monotonic() - started
    finally:
        fault.close()
    assert verdict.action == action and says in str(verdict.error), verdict
    assert took < 1.5 + 1.0, f"took {took:.1f} s with a 1.5 s deadline"


def _hostile_list(conn: socket.socket) -> None:
    entries = [{"digest": "sha256:" + f"{i:064x}", "size": 1,
                "platform": {"os": "linux\n", "architecture": f"\x1b[31mrisc{i % 20}\u202e"}}
               for i in range(1000)]
    body = json.dumps({"schemaVersion": 2, "manifests": entries}).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def test_hostile_platform_names_are_escaped_and_capped() -> None:
    from grace_policy.messages import user_lines

    fault = Fault(_hostile_list)
    try:
        verdict = _decide(_step(f"{fault.address}#lab/img:v1"), "x86_64")
    finally:
        fault.close()
    assert verdict.action == "reject" and verdict.findings[0].rule == "image-arch-mismatch"
    text = "\n".join(user_lines(verdict))
    assert "\x1b" not in text and "\u202e" not in text
    assert "and 12 more" in text  # 20 distinct names, 8 shown
    assert all(line.startswith("grace-policy: ") for line in text.splitlines())


class Proxy(Fault):
    """A forwarding HTTP proxy (absolute-form requests, as curl sends them to
    an ``http_proxy``) in front of the real registry; it notes each request."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        super().__init__(None)

    def _one(self, conn: socket.socket) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            first, rest = head.split(b"\r\n", 1)
            method, url, version = first.decode().split(" ")
            self.seen.append(url)
            hostport, _, path = url.removeprefix("http://").partition("/")
            host, port = hostport.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as up:
                up.sendall(f"{method} /{path} {version}\r\n".encode() + rest)
                while data := up.recv(65536):
                    conn.sendall(data)
            conn.close()
        except OSError:
            pass


def test_http_proxy_from_the_environment(anon) -> None:  # type: ignore[no-untyped-def]
    reg, _ = anon
    proxy = Proxy()
    try:
        env = {"http_proxy": f"http://{proxy.address}", "HTTP_PROXY": "http://127.0.0.1:9"}
        step = _step(f"{reg.address}#lab/img:arm", Settings(allow_http=True, env=env))
        assert _decide(step, "x86_64").action == "reject"
        assert proxy.seen and all(u.startswith(f"http://{reg.address}/v2/") for u in proxy.seen)
        # no_proxy names the registry: straight there (curl's rule).
        proxy.seen.clear()
        env["no_proxy"] = "localhost,127.0.0.1"
        step = _step(f"{reg.address}#lab/img:arm", Settings(allow_http=True, env=env))
        assert _decide(step, "x86_64").action == "reject" and not proxy.seen
    finally:
        proxy.close()


def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nobody listens
    with pytest.raises(RegistryError, match="cannot connect"):
        resolve(parse(f"127.0.0.1:{port}#img:v1"), "x86_64", HTTP,  # type: ignore[arg-type]
                Budget(2000))
    verdict = _decide(_step(f"127.0.0.1:{port}#img:v1"), "x86_64", on_error="deny")
    assert verdict.action == "reject" and "cannot connect" in str(verdict.error)


def test_deadline_is_the_budget() -> None:
    fault = Fault(_never)
    try:
        budget = Budget(300)
        started = time.monotonic()
        with pytest.raises(BudgetExceeded):
            resolve(parse(f"{fault.address}#img:v1"), "x86_64", HTTP,  # type: ignore[arg-type]
                    budget)
        assert time.monotonic() - started < 1.3
    finally:
        fault.close()
