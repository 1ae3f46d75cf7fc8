"""Addresses and ports."""

import socket
from urllib.parse import urlparse


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago; bind to port 0 instead wherever the API allows it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def host_for_peers(bind_host: str) -> str:
    """The address other processes should dial to reach a socket bound on `bind_host`."""
    if bind_host in ("0.0.0.0", ""):
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    return bind_host


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` or `scheme://host:port/...` → (host, port)."""
    if "://" in address:
        parsed = urlparse(address)
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"address {address!r} has no host:port")
        return parsed.hostname, parsed.port
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host, int(port)


def redact_url(url: str) -> str:
    """The URL with any password replaced, for logs and error messages."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
    return parsed._replace(netloc=netloc).geturl()


def bind_gloo_to(bind_host: str) -> str:
    """Make this process's gloo pair sockets listen on `bind_host`; returns the interface used.

    gloo listens on the address the hostname resolves to unless GLOO_SOCKET_IFNAME names an
    interface, so this names the interface that owns `bind_host` (call before
    init_process_group). A wildcard host leaves gloo's choice alone ("")."""
    import os

    import psutil

    if bind_host in ("0.0.0.0", ""):
        return ""
    ip = socket.gethostbyname(bind_host)
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return name
    raise ValueError(
        f"cluster.bind_host={bind_host!r} ({ip}) is the address of no network interface of this "
        "host; gloo could not listen on it"
    )
