"""Outbound HTTP to an address a tenant names (webhook callbacks): the name is resolved
once, every address it gives is checked against every special-purpose range, and the
request goes to exactly that checked address, so a DNS answer that changes between the
check and the connect (rebinding) cannot steer it inside. The whole exchange (resolve,
connect, TLS handshake, request, response status line) runs under one deadline: a
receiver that drips a byte a second holds a worker no longer than any other.

The Host header and TLS (SNI and certificate verification) keep the URL's name. Errors say
"not allowed", never what a name resolved to: the answer must not become a probe of the
fleet's network.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> the addresses it resolves to; tests pass their own.
Resolver = Callable[[str, int], list[str]]

# Every range of IANA's IPv4 and IPv6 special-purpose address registries, whether or not
# the registry marks it globally reachable (no webhook receiver lives on an AS112 or AMT
# anycast address), plus multicast and the reserved space.
SPECIAL_V4 = tuple(
    ipaddress.IPv4Network(net)
    for net in (
        "0.0.0.0/8",  # this network
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local (cloud metadata)
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments (192.0.0.192 among them)
        "192.0.2.0/24",  # documentation
        "192.31.196.0/24",  # AS112-v4
        "192.52.193.0/24",  # AMT
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",  # private
        "192.175.48.0/24",  # direct delegation AS112
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the limited broadcast 255.255.255.255
    )
)
SPECIAL_V6 = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "::/96",  # unspecified, loopback and IPv4-compatible (::127.0.0.1)
        "::ffff:0:0/96",  # IPv4-mapped (checked as their IPv4 address instead)
        "64:ff9b::/96",  # NAT64, well-known prefix
        "64:ff9b:1::/48",  # NAT64, local-use prefix
        "100::/64",  # discard-only
        "100:0:0:1::/64",  # dummy prefix
        "2001::/23",  # IETF protocol assignments: Teredo 2001::/32, ORCHID, benchmarking…
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4 (embeds any IPv4 address, private ones included)
        "2620:4f:8000::/48",  # direct delegation AS112
        "3fff::/20",  # documentation
        "5f00::/16",  # SRv6 SIDs
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
STATUS_LINE_MAX = 8192


class UnsafeCallbackURL(ValueError):
    """A callback URL that is malformed, not http(s), or not allowed to be reached."""


class DeadlineExceeded(TimeoutError):
    """The exchange did not finish within its one deadline."""


@dataclass(frozen=True)
class Target:
    """A URL whose host was resolved and checked once: connect only to `addresses`."""

    scheme: str
    host: str  # the name: Host header, SNI and certificate verification
    port: int
    path: str  # path and query
    addresses: tuple[str, ...]

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def address_allowed(address: IPAddress) -> bool:
    """Whether a webhook may connect to `address`: a global unicast address outside every
    special-purpose range. An IPv4-mapped IPv6 address is judged as its IPv4 address;
    every other IPv6 form that embeds IPv4 (NAT64, 6to4, Teredo, compatible) is refused
    whole, since the IPv4 address it leads to cannot be known here."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address_allowed(address.ipv4_mapped)
        if address not in GLOBAL_UNICAST_V6 or any(address in net for net in SPECIAL_V6):
            return False
    elif any(address in net for net in SPECIAL_V4):
        return False
    return address.is_global and not address.is_multicast


def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver, in its order, each once."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _resolve_within(resolver: Resolver, host: str, port: int, deadline: float) -> list[str]:
    """`resolver(host, port)` in a daemon thread: getaddrinfo has no timeout of its own, and
    a resolver that hangs must not hold the caller past its deadline."""
    result: list[list[str] | BaseException] = []

    def run() -> None:
        try:
            result.append(resolver(host, port))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result.append(exc)

    thread = threading.Thread(target=run, name="ocrfleet-resolve", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not result:
        raise DeadlineExceeded("resolving the callback host took longer than the deadline")
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def resolve(
    url: str,
    *,
    allow_private: bool,
    deadline: float,
    resolver: Resolver | None = None,
) -> Target:
    """Parse `url`, resolve its host once and check every address (unless `allow_private`).
    The one place a callback host is ever resolved; `deadline` is a `time.monotonic()`."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise UnsafeCallbackURL("callback_url has an invalid port") from exc
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise UnsafeCallbackURL("callback_url must be an http(s) URL with a host")
    if any(ch in url for ch in "\r\n\x00 "):
        raise UnsafeCallbackURL("callback_url must not contain spaces or control characters")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = _resolve_within(resolver or system_resolver, host, port, deadline)
        parsed = [ipaddress.ip_address(address.split("%", 1)[0]) for address in addresses]
    except DeadlineExceeded:
        raise
    except (OSError, ValueError, UnicodeError) as exc:
        raise UnsafeCallbackURL("callback_url is not allowed: its host does not resolve") from exc
    if not parsed:
        raise UnsafeCallbackURL("callback_url is not allowed: its host does not resolve")
    if not allow_private and not all(address_allowed(address) for address in parsed):
        raise UnsafeCallbackURL(
            "callback_url is not allowed: its host is not a public internet address "
            "(OCRFLEET_WEBHOOK_ALLOW_PRIVATE=true allows private ones, for development)"
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connect_to = tuple(
        str(address.ipv4_mapped or address)
        if isinstance(address, ipaddress.IPv6Address)
        else str(address)
        for address in parsed
    )
    return Target(parts.scheme, host, port, path, connect_to)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the receiver did not answer within the deadline")
    return left


def _connect(target: Target, deadline: float) -> socket.socket:
    """A TCP connection to the first of the checked addresses that accepts one."""
    error: OSError | None = None
    for address in target.addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect((address, target.port))
            return sock
        except DeadlineExceeded:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            error = exc
    if isinstance(error, TimeoutError):
        raise DeadlineExceeded("connecting to the receiver took longer than the deadline")
    raise ConnectionError(f"cannot connect to the receiver: {type(error).__name__}")


def post(
    target: Target,
    body: bytes,
    headers: Mapping[str, str],
    *,
    deadline: float,
    tls: ssl.SSLContext | None = None,
) -> int:
    """POST `body` to the checked `target` and return the response's status code, all
    before `deadline` (a `time.monotonic()`); DeadlineExceeded past it. Only the status
    line is read: a webhook needs nothing else from the receiver."""
    sock = _connect(target, deadline)
    try:
        if target.scheme == "https":
            context = tls or ssl.create_default_context()
            sock.settimeout(_remaining(deadline))  # bounds the whole handshake
            sock = context.wrap_socket(sock, server_hostname=target.host)
        request = _request(target, body, headers)
        sock.settimeout(_remaining(deadline))  # sendall: a bound on the whole send
        sock.sendall(request)
        return _status(sock, deadline)
    except TimeoutError as exc:
        raise DeadlineExceeded("the receiver did not answer within the deadline") from exc
    finally:
        sock.close()


def _request(target: Target, body: bytes, headers: Mapping[str, str]) -> bytes:
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}"]
    fields: Iterable[tuple[str, str]] = (
        *headers.items(),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    )
    for name, value in fields:
        if any(ch in name + value for ch in "\r\n\x00"):
            raise ValueError(f"header {name!r} holds a control character")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _status(sock: socket.socket, deadline: float) -> int:
    """The status code of the response's status line, read under the deadline however
    slowly the receiver sends it."""
    received = b""
    while b"\r\n" not in received:
        if len(received) > STATUS_LINE_MAX:
            raise ValueError("the receiver's status line is too long")
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(1024)
        if not chunk:
            raise ConnectionError("the receiver closed the connection before its status line")
        received += chunk
    line = received.split(b"\r\n", 1)[0].decode("latin-1")
    version, _, rest = line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError("the receiver did not answer with an HTTP/1.x status line")
    return int(code)
