"""TLS for the HTTP API and the session: `[node] tls_cert`, `tls_key`, `tls_client_ca`,
`tls_peer_ca` (node/base/settings.py TlsFiles).

* `load(files)` reads and checks the PEM files and builds the server's SSLContext (TLS 1.2 at
  least, the ssl module's default ciphers). Every problem is a ConfigError naming the key: a
  missing or unreadable file, no certificate or key in it, an encrypted key, a key that does not
  match the certificate, a certificate (or client CA) that has expired or is not valid yet.
* `TlsSite` serves the aiohttp app over TLS. It accepts connections itself and picks the
  context for each one when it is accepted, so `reload()` (SIGHUP, node/server.py) changes the
  certificate and the client CA for new connections while established ones go on; a reload
  that fails keeps what was loaded. A client speaking plain HTTP to the TLS port gets one
  `400 tls_required` answer naming the https:// URL instead of a closed connection.
* mTLS (`tls_client_ca`): a client certificate that does not verify against the CA fails the
  handshake. A client without any certificate completes it (the context asks for a certificate
  without demanding one) and gets one `401 client_certificate_required` answer, then the
  connection is closed: nothing it sends reaches the API. Demanding the certificate inside the
  handshake would refuse it just as well, but under TLS 1.3 the client only sees its
  connection closed (asyncio drops the alert), and the answer says what is missing.
* `peer_context(files)`: the context of the node's own calls to its peers' https URLs (GET
  /v1/cluster/nodes asks every member for its view): it trusts `tls_peer_ca`, else
  `tls_client_ca`, else the system's store, and presents the node's certificate, for peers that
  require client certificates.

The Raft link does not use TLS: it is encrypted and authenticated with the cluster secret
(node/raft/encryptor.py), so rotating a certificate never touches it.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import hashlib
import ipaddress
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

from ..core.limits import ConfigError
from .readable import readable
from .settings import TlsFiles

log = logging.getLogger("raftq.tls")

HANDSHAKE_TIMEOUT_S = 10.0
EXPIRY_WARNING_DAYS = 14


# ---------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class CertInfo:
    subject: str
    issuer: str
    not_before: _dt.datetime
    not_after: _dt.datetime
    names: tuple[str, ...]          # subjectAltName DNS names and IP addresses
    sha256: str

    def line(self) -> str:
        names = f"; names {', '.join(self.names)}" if self.names else ""
        return (f"{self.subject} (issuer {self.issuer}{names}; not after {_iso(self.not_after)}; "
                f"sha256 {self.sha256[:16]})")


@dataclass(frozen=True)
class Loaded:
    files: TlsFiles
    context: ssl.SSLContext
    cert: CertInfo
    client_ca: tuple[CertInfo, ...] | None
    loaded_at: float

    def describe(self) -> str:
        text = f"certificate {self.cert.line()} from {self.files.cert}"
        if self.client_ca is not None:
            text += ("; client certificates required, signed by "
                     + " or ".join(c.subject for c in self.client_ca) + f" (from {self.files.client_ca})")
        return text


def _iso(t: _dt.datetime) -> str:
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read(where: str, path: Path) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read {path} ({e.strerror or e})")
    if not data.strip():
        raise ConfigError(f"{where}: {path} is empty")
    return data


def _certs(where: str, path: Path, data: bytes):
    from cryptography import x509
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise ConfigError(f"{where}: {path} holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")")
    return certs


def info(cert) -> CertInfo:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple([*san.get_values_for_type(x509.DNSName),
                       *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))])
    except x509.ExtensionNotFound:
        names = ()
    der = cert.public_bytes(serialization.Encoding.DER)
    return CertInfo(subject=cert.subject.rfc4514_string() or "(empty subject)",
                    issuer=cert.issuer.rfc4514_string() or "(empty issuer)",
                    not_before=cert.not_valid_before_utc, not_after=cert.not_valid_after_utc, names=names,
                    sha256=hashlib.sha256(der).hexdigest())


def _check_dates(where: str, path: Path, cert, what: str, now: _dt.datetime) -> CertInfo:
    i = info(cert)
    if now > i.not_after:
        raise ConfigError(f"{where}: the {what} in {path} ({i.subject}) expired on {_iso(i.not_after)}")
    if now < i.not_before:
        raise ConfigError(f"{where}: the {what} in {path} ({i.subject}) is not valid before {_iso(i.not_before)} "
                          "(is this machine's clock right?)")
    return i


def _public(key) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _private_key(path: Path, data: bytes):
    from cryptography.hazmat.primitives import serialization
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(f"node.tls_key: {path} is encrypted; give the node an unencrypted key file "
                          "(readable by the node's user only)")
    except (ValueError, Exception) as e:
        raise ConfigError(f"node.tls_key: {path} holds no usable PEM private key ({str(e).splitlines()[0] if str(e) else type(e).__name__})")


def load(files: TlsFiles, now: _dt.datetime | None = None) -> Loaded:
    """Read and check the files; the server context for them. Raises ConfigError naming the key."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    cert_pem = _read("node.tls_cert", files.cert)
    chain = _certs("node.tls_cert", files.cert, cert_pem)
    cert = _check_dates("node.tls_cert", files.cert, chain[0], "certificate", now)
    key_pem = _read("node.tls_key", files.key)
    key = _private_key(files.key, key_pem)
    if _public(key.public_key()) != _public(chain[0].public_key()):
        raise ConfigError(f"node.tls_key: {files.key} does not match the certificate in {files.cert} "
                          f"({cert.subject}): give the key the certificate was made for")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(files.cert), str(files.key))
    except ssl.SSLError as e:
        raise ConfigError(f"node.tls_cert: OpenSSL refuses the certificate or its key ({e.reason or e})")
    client_ca = None
    if files.client_ca is not None:
        ca_pem = _read("node.tls_client_ca", files.client_ca)
        client_ca = tuple(_check_dates("node.tls_client_ca", files.client_ca, c, "CA certificate", now)
                          for c in _certs("node.tls_client_ca", files.client_ca, ca_pem))
        try:
            ctx.load_verify_locations(cadata=ca_pem.decode("ascii", "replace"))
        except ssl.SSLError as e:
            raise ConfigError(f"node.tls_client_ca: OpenSSL refuses {files.client_ca} ({e.reason or e})")
        # Asked for, verified when given, and demanded by _Gate when missing (see the docstring).
        ctx.verify_mode = ssl.CERT_OPTIONAL
    if files.peer_ca is not None:
        _certs("node.tls_peer_ca", files.peer_ca, _read("node.tls_peer_ca", files.peer_ca))
    return Loaded(files=files, context=ctx, cert=cert, client_ca=client_ca, loaded_at=time.time())


def warnings_for(loaded: Loaded, url: str, now: _dt.datetime | None = None) -> list[str]:
    """What is worth a warning in the log: a certificate that expires soon, or that does not
    name the host of the node's URL (clients checking host names would refuse it)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    out = []
    left = loaded.cert.not_after - now
    if left < _dt.timedelta(days=EXPIRY_WARNING_DAYS):
        out.append(f"node.tls_cert: the certificate expires in {left.days} days ({_iso(loaded.cert.not_after)}); "
                   "renew it and send the node SIGHUP")
    host = url.split("://", 1)[-1].split("/", 1)[0].rpartition(":")[0].strip("[]") or url
    if loaded.cert.names and not names_host(loaded.cert.names, host):
        out.append(f"node.tls_cert: the certificate names {', '.join(loaded.cert.names)} but not {host} "
                   "(the host of node.url): clients that check host names will refuse it")
    return out


def names_host(names, host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for n in names:
        if ip is not None:
            try:
                if ipaddress.ip_address(n) == ip:
                    return True
            except ValueError:
                pass
            continue
        n, h = n.lower(), host.lower()
        if n == h or (n.startswith("*.") and "." in h and h.split(".", 1)[1] == n[2:]):
            return True
    return False


# ---------------------------------------------------------------------------- serving
def _answer(status: str, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Raftq-Tls: {code}\r\nConnection: close\r\n\r\n").encode() + body


class _Gate(asyncio.Protocol):
    """mTLS: a connection whose client presented a certificate (the handshake verified it) is
    handed to aiohttp's protocol at once; one without gets a 401 answer to its first request
    and is closed. Only connections of an mTLS node pass through here, each once."""

    def __init__(self, factory, message: bytes):
        self.factory, self.message = factory, message
        self.transport = None
        self.timer = None

    def connection_made(self, transport):
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.getpeercert():
            protocol = self.factory()
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            return
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(5.0, self._refuse)
        peer = transport.get_extra_info("peername")
        _handshake_log(f"refused a client without a certificate ({_peer(peer)}): tls_client_ca requires one")

    def data_received(self, data):
        self._refuse()

    def eof_received(self):
        self._refuse()
        return False

    def _refuse(self):
        t, self.transport = self.transport, None
        if t is not None and not t.is_closing():
            t.write(self.message)
            t.close()

    def connection_lost(self, exc):
        if self.timer is not None:
            self.timer.cancel()


_last_log = [0.0, 0]


def _handshake_log(text: str) -> None:
    """At most one line per 10 s about refused connections (a port scanner must not flood the log)."""
    now = time.monotonic()
    if now - _last_log[0] >= 10.0:
        more = f" (and {_last_log[1]} more since the last such line)" if _last_log[1] else ""
        log.info("TLS: %s%s", text, more)
        _last_log[0], _last_log[1] = now, 0
    else:
        _last_log[1] += 1


def _why(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError) and e.reason:
        return e.reason.lower().replace("_", " ")
    if isinstance(e, (ConnectionResetError, ssl.SSLEOFError, BrokenPipeError)):
        return ("the client closed the connection (a client that does not trust this node's certificate "
                "does that)")
    if isinstance(e, asyncio.TimeoutError):
        return "no handshake in time"
    return str(e) or type(e).__name__


def _peer(addr) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)


def _listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for host:port (every address the host resolves to), as asyncio's
    create_server makes them: SO_REUSEADDR, IPv6 sockets IPv6-only, non-blocking."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks, seen = [], set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(addr)
            s.listen(backlog)
            s.setblocking(False)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class TlsSite(web.BaseSite):
    """The API over TLS on host:port. Connections are accepted here, one task each: the first
    byte tells TLS (a handshake record, 0x16) from plain HTTP, then the handshake runs with the
    context loaded when the connection came in, and the connection joins aiohttp's server like
    any other (keep-alive, WebSocket upgrade, shutdown)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, loaded: Loaded, url: str,
                 backlog: int = 128, handshake_timeout: float = HANDSHAKE_TIMEOUT_S, max_pending: int = 1000):
        super().__init__(runner, backlog=backlog)
        self.host, self.port, self.loaded, self.url = host, port, loaded, url
        self.handshake_timeout = handshake_timeout
        # Connections not yet handed to aiohttp (first byte, TLS handshake) are not among the
        # server's connections that tuning.max_connections bounds: at most `max_pending` of
        # them at once, the oldest closed to make room (a client's handshake takes a round trip
        # or two; a connection that never sends holds a slot until handshake_timeout).
        self.max_pending = max_pending
        self._pending: dict[asyncio.Task, None] = {}        # in arrival order
        self._socks: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()
        self._plain = _answer("400 Bad Request", "tls_required",
                              f"this node serves HTTPS only: use {url} (plain HTTP is not answered here)")
        self._no_cert = _answer("401 Unauthorized", "client_certificate_required",
                                "this node requires a client certificate (mTLS): present one signed by the CA in "
                                "its tls_client_ca")

    @property
    def name(self) -> str:
        return self.url

    async def start(self) -> None:
        await super().start()
        self._socks = _listen(self.host, self.port, self._backlog)
        loop = asyncio.get_running_loop()
        for s in self._socks:
            self._spawn(loop, self._accept(loop, s))

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for s in self._socks:
            s.close()
        self._socks = []
        await super().stop()

    def reload(self) -> Loaded:
        """Load the same files again; new connections get the result, established ones keep
        theirs. Raises ConfigError (and keeps what was loaded) when the files do not load."""
        self.loaded = load(self.loaded.files)
        return self.loaded

    def _spawn(self, loop, coro) -> None:
        t = loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _accept(self, loop, lsock: socket.socket) -> None:
        while True:
            try:
                conn, _ = await loop.sock_accept(lsock)
            except OSError as e:            # EMFILE and the like: wait, do not spin
                log.warning("TLS: accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            if len(self._pending) >= self.max_pending:
                oldest = next(iter(self._pending))
                self._pending.pop(oldest)
                oldest.cancel()
                from . import bounds
                bounds.hit("max_connections_evicted")
            t = loop.create_task(self._connection(loop, conn))
            self._tasks.add(t)
            self._pending[t] = None
            t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        self._pending.pop(t, None)

    async def _connection(self, loop, conn: socket.socket) -> None:
        loaded = self.loaded                 # the context of this connection, whatever reloads follow
        handed = False
        peer = "?"
        try:
            peer = _peer(conn.getpeername())
            conn.setblocking(False)
            try:
                first = await asyncio.wait_for(self._peek(loop, conn), self.handshake_timeout)
            except (asyncio.TimeoutError, OSError):
                return
            if not first:
                return
            if first[0] != 0x16:
                await self._refuse_plain(loop, conn)
                return
            server = self._runner.server
            factory = server if loaded.client_ca is None else (lambda: _Gate(server, self._no_cert))
            handed = True                    # from here on the transport owns the socket
            await loop.connect_accepted_socket(factory, conn, ssl=loaded.context,
                                               ssl_handshake_timeout=self.handshake_timeout)
            self._pending.pop(asyncio.current_task(), None)     # handed over: aiohttp's bounds hold
        except asyncio.CancelledError:
            raise
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as e:
            _handshake_log(f"handshake with {peer} failed: {_why(e)}")
        finally:
            if not handed:
                conn.close()

    @staticmethod
    async def _peek(loop, conn: socket.socket) -> bytes:
        await readable(loop, conn.fileno())
        return conn.recv(1, socket.MSG_PEEK)

    async def _refuse_plain(self, loop, conn: socket.socket) -> None:
        """Plain HTTP on the TLS port: read what came, answer 400 tls_required, close."""
        try:
            await asyncio.wait_for(loop.sock_recv(conn, 65536), 1.0)
            await asyncio.wait_for(loop.sock_sendall(conn, self._plain), 2.0)
            conn.shutdown(socket.SHUT_WR)
            await asyncio.wait_for(loop.sock_recv(conn, 65536), 0.5)    # let the client read it first
        except (OSError, asyncio.TimeoutError):
            pass


# ---------------------------------------------------------------------------- calls to peers
def peer_context(files: TlsFiles | None) -> ssl.SSLContext | None:
    """The context of the node's own calls to https peers (GET /v1/cluster/nodes, for the admin
    page); None without TLS (aiohttp's default)."""
    if files is None:
        return None
    ca = files.peer_ca or files.client_ca
    ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(files.cert), str(files.key))
    return ctx


def peer_problem(e: BaseException) -> str | None:
    """Why a call to a peer's https URL failed at the TLS level (worth a warning), or None."""
    import aiohttp
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        why = getattr(e.certificate_error, "verify_message", None) or str(e.certificate_error)
        return (f"its certificate does not verify ({why}); set node.tls_peer_ca to the CA of the nodes' "
                "certificates")
    if isinstance(e, aiohttp.ClientSSLError):
        return f"TLS handshake failed ({getattr(getattr(e, 'os_error', None), 'reason', None) or e})"
    return None
