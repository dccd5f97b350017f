"""A small HTTP/1.1 client on the standard library, bounded by the check's
deadline.

Why not :mod:`http.client` or :mod:`urllib`: a registry that answers one
byte at a time keeps every ``recv`` under a socket timeout while the whole
exchange runs far past the check's deadline. Here every socket operation
(name lookup, connect, TLS handshake, each ``recv``) gets the time left of
the :class:`~grace_policy.budget.Budget`, and headers and bodies are capped,
so a hostile or broken registry ends the check on time with
:class:`~grace_policy.registry.RegistryError` or
:class:`~grace_policy.budget.BudgetExceeded`.

Like enroot's curl (``-L``, proxies from the environment): redirects are
followed (without the ``Authorization`` header when the host changes),
``https_proxy``/``http_proxy``/``all_proxy`` (either case, except
``HTTP_PROXY``, which curl ignores) and ``no_proxy`` apply.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

from .._record import dataclass
from ..budget import Budget, BudgetExceeded
from . import RegistryError

#: The most of a status line and headers read.
MAX_HEAD = 64 * 1024
MAX_REDIRECTS = 5
_CHUNK = 65536


@dataclass(frozen=True)
class Response:
    status: int
    #: Header names in lower case; a repeated header's values joined by ", "
    #: except ``www-authenticate``, which keeps the first.
    headers: dict[str, str]
    body: bytes
    url: str


@dataclass(frozen=True)
class Url:
    scheme: str
    host: str
    port: int
    target: str

    @property
    def netloc(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.target}"


def parse_url(text: str) -> Url:
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise RegistryError(f"not an http(s) address: {text[:200]!r}")
    hostport, slash, path = rest.partition("/")
    if "@" in hostport:
        hostport = hostport.rpartition("@")[2]
    target = "/" + path if slash else "/"
    port = 443 if scheme == "https" else 80
    host = hostport
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        if tail.startswith(":"):
            port = _port(tail[1:])
    elif ":" in hostport:
        host, _, p = hostport.rpartition(":")
        port = _port(p)
    if not host:
        raise RegistryError(f"no host in {text[:200]!r}")
    return Url(scheme, host, port, target)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise RegistryError(f"bad port {text[:20]!r}")
    return int(text)


def _left(budget: Budget) -> float:
    budget.tick()
    return max(budget.deadline - time.monotonic(), 0.001)


def _proxy_for(url: Url, env: Mapping[str, str]) -> str | None:
    """curl's choice of proxy for ``url``."""
    no = env.get("no_proxy", env.get("NO_PROXY", ""))
    for item in no.split(","):
        item = item.strip().lstrip(".").lower()
        if item == "*" or (item and (url.host.lower() == item
                                     or url.host.lower().endswith("." + item))):
            return None
    if url.scheme == "https":
        names = ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
    else:
        names = ("http_proxy", "all_proxy", "ALL_PROXY")
    for name in names:
        value = env.get(name)
        if value:
            return value if "://" in value else "http://" + value
    return None


def _resolve(host: str, port: int, budget: Budget) -> tuple:  # type: ignore[type-arg]
    """getaddrinfo bounded by the deadline: a name lookup cannot be
    interrupted, so a slow one runs in a daemon thread that is left behind."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_NUMERICHOST)[0]
    except socket.gaierror:
        pass
    import threading

    out: list[object] = []

    def look() -> None:
        try:
            out.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0])
        except OSError as exc:
            out.append(exc)

    worker = threading.Thread(target=look, daemon=True, name="grace-registry-dns")
    worker.start()
    worker.join(_left(budget))
    if not out:
        raise BudgetExceeded(f"the name lookup of {host!r} took longer than the deadline")
    if isinstance(out[0], OSError):
        raise RegistryError(f"cannot resolve {host!r}: {out[0]}")
    return out[0]  # type: ignore[return-value]


def _connect(host: str, port: int, budget: Budget) -> socket.socket:
    family, kind, proto, _name, addr = _resolve(host, port, budget)
    sock = socket.socket(family, kind, proto)
    try:
        sock.settimeout(_left(budget))
        sock.connect(addr)
    except TimeoutError:
        sock.close()
        raise BudgetExceeded(f"connecting to {host}:{port} took longer than the deadline") \
            from None
    except OSError as exc:
        sock.close()
        raise RegistryError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") \
            from None
    return sock


class _Conn:
    """One connection, one request (``Connection: close``)."""

    def __init__(self, sock: socket.socket, budget: Budget) -> None:
        self.sock = sock
        self.budget = budget
        self.buf = b""
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.settimeout(_left(self.budget))
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise BudgetExceeded("sending to the registry took longer than the deadline") \
                from None

    def fill(self) -> bool:
        if self.eof:
            return False
        self.sock.settimeout(_left(self.budget))
        try:
            data = self.sock.recv(_CHUNK)
        except TimeoutError:
            raise BudgetExceeded("the registry did not answer within the check's deadline") \
                from None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise RegistryError("the registry's answer headers are too long")
            if not self.fill():
                raise RegistryError("the registry closed the connection without an answer")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        if len(head) > MAX_HEAD:
            raise RegistryError("the registry's answer headers are too long")
        lines = head.decode("latin-1").split("\r\n")
        words = lines[0].split(" ", 2)
        if len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
            raise RegistryError("the registry's answer is not HTTP")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                continue
            name, value = name.strip().lower(), value.strip()
            if name in headers:
                if name != "www-authenticate":
                    headers[name] += ", " + value
            else:
                headers[name] = value
        return int(words[1]), headers

    def body(self, headers: Mapping[str, str], cap: int) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._chunked(cap)
        length = headers.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                raise RegistryError("the registry sent a bad Content-Length")
            want = int(length)
            if want > cap:
                raise RegistryError(f"the registry's answer is {want} bytes, more than the "
                                    f"{cap} this check reads")
            while len(self.buf) < want:
                if not self.fill():
                    raise RegistryError("the registry closed the connection mid-answer")
            return self.buf[:want]
        while self.fill():
            if len(self.buf) > cap:
                raise RegistryError(f"the registry's answer is more than the {cap} bytes "
                                    "this check reads")
        return self.buf

    def _chunked(self, cap: int) -> bytes:
        out = b""
        while True:
            while b"\r\n" not in self.buf:
                if len(self.buf) > 1024 or not self.fill():
                    raise RegistryError("the registry sent a bad chunked answer")
            line, _, self.buf = self.buf.partition(b"\r\n")
            try:
                size = int(line.split(b";")[0].strip() or b"x", 16)
            except ValueError:
                raise RegistryError("the registry sent a bad chunked answer") from None
            if size == 0:
                return out
            if len(out) + size > cap:
                raise RegistryError(f"the registry's answer is more than the {cap} bytes "
                                    "this check reads")
            while len(self.buf) < size + 2:
                if not self.fill():
                    raise RegistryError("the registry closed the connection mid-answer")
            out += self.buf[:size]
            self.buf = self.buf[size + 2:]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _open(url: Url, env: Mapping[str, str], budget: Budget) -> tuple[_Conn, bool]:
    """A connection to ``url`` (through its proxy), and whether requests
    must name the absolute URL (plain http through a proxy)."""
    proxy = _proxy_for(url, env)
    if proxy is None:
        sock = _connect(url.host, url.port, budget)
        absolute = False
    else:
        purl = parse_url(proxy)
        sock = _connect(purl.host, purl.port, budget)
        absolute = url.scheme == "http"
        if url.scheme == "https":
            conn = _Conn(sock, budget)
            conn.send(f"CONNECT {url.host}:{url.port} HTTP/1.1\r\nHost: {url.host}:{url.port}"
                      f"\r\n{_proxy_auth(proxy)}\r\n".encode("latin-1"))
            status, _ = conn.head()
            if status != 200:
                conn.close()
                raise RegistryError(f"the proxy refused the tunnel to {url.netloc} "
                                    f"(HTTP {status})")
            sock = conn.sock
    if url.scheme == "https":
        import ssl

        context = ssl.create_default_context()
        try:
            sock.settimeout(_left(budget))
            sock = context.wrap_socket(sock, server_hostname=url.host)
        except TimeoutError:
            sock.close()
            raise BudgetExceeded("the TLS handshake took longer than the deadline") from None
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise RegistryError(f"TLS with {url.netloc} failed: "
                                f"{getattr(exc, 'reason', None) or exc}") from None
    return _Conn(sock, budget), absolute


def _proxy_auth(proxy: str) -> str:
    rest = proxy.partition("://")[2]
    if "@" not in rest.partition("/")[0]:
        return ""
    import base64
    from urllib.parse import unquote

    userinfo = rest.partition("/")[0].rpartition("@")[0]
    token = base64.b64encode(unquote(userinfo).encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


def request(method: str, url: str, headers: Mapping[str, str], budget: Budget, *,
            env: Mapping[str, str], cap: int) -> Response:
    """One request, redirects followed; the body (at most ``cap`` bytes;
    none for HEAD). Raises RegistryError or BudgetExceeded."""
    current = parse_url(url)
    for value in (*headers.keys(), *headers.values()):
        if any(c in value for c in "\r\n\0") or not value.isascii():
            # A token from a realm's answer is the only outside text here.
            raise RegistryError("a header value the registry gave is not a valid header")
    sent = dict(headers)
    for _hop in range(MAX_REDIRECTS + 1):
        conn, absolute = _open(current, env, budget)
        try:
            target = str(current) if absolute else current.target
            lines = [f"{method} {target} HTTP/1.1", f"Host: {current.netloc}",
                     "User-Agent: grace-policy", "Connection: close"]
            lines += [f"{k}: {v}" for k, v in sent.items()]
            conn.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            status, got = conn.head()
            if status in (301, 302, 303, 307, 308) and "location" in got:
                nxt = _join(current, got["location"])
                if (nxt.host, nxt.port) != (current.host, current.port):
                    sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
                current = nxt
                if status == 303:
                    method = "GET" if method != "HEAD" else method
                continue
            body = b"" if method == "HEAD" or status in (204, 304) else conn.body(got, cap)
            budget.spend_bytes(len(body))
            return Response(status, got, body, str(current))
        finally:
            conn.close()
    raise RegistryError(f"more than {MAX_REDIRECTS} redirects from {parse_url(url).netloc}")


def _join(base: Url, location: str) -> Url:
    if "://" in location:
        return parse_url(location)
    if location.startswith("/"):
        return Url(base.scheme, base.host, base.port, location)
    head = base.target.split("?")[0].rpartition("/")[0]
    return Url(base.scheme, base.host, base.port, f"{head}/{location}")
