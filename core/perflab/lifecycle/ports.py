"""Ports: choosing a free one, and telling whether one is still bound (and by whom)."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import anyio
import psutil


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind_host(host: str) -> str:
    """The address to test-bind for an engine that binds ``host`` ("" means all addresses)."""
    return host or "0.0.0.0"


def connect_host(host: str) -> str:
    """The address a client on this machine uses to reach an engine bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


# Ports handed to engines of this process that have not been torn down yet. An engine binds
# its port only once it has loaded (minutes, for a large model): until then the port looks
# free, and a second engine started meanwhile (``perflab run --parallel``) must not get it.
_HELD: set[int] = set()
_HELD_LOCK = threading.Lock()
_PICK_TRIES = 64


def hold(ports: Iterable[int]) -> None:
    """Mark ``ports`` as given to an engine of this process (until :func:`unhold`)."""
    with _HELD_LOCK:
        _HELD.update(ports)


def unhold(ports: Iterable[int]) -> None:
    with _HELD_LOCK:
        _HELD.difference_update(ports)


def held(ports: Iterable[int]) -> list[int]:
    """Those of ``ports`` another engine of this process holds (it may not have bound them yet)."""
    with _HELD_LOCK:
        return [p for p in ports if p in _HELD]


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, chosen by the kernel (bind to port 0), and not
    held by another engine of this process (:func:`hold`)."""
    for _ in range(_PICK_TRIES):
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            s.bind((bind_host(host), 0))
            port = int(s.getsockname()[1])
        if not held([port]):
            return port
    return port


def port_is_free(host: str, port: int) -> bool:
    """True when an engine could bind ``host:port`` now.

    SO_REUSEADDR is set the way servers (uvicorn, aiohttp) set it, so a connection lingering
    in TIME_WAIT after a previous engine does not count as "taken", while any listener does.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host(host), port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
        return True


def taken_ports(host: str, ports: Iterable[int]) -> list[int]:
    return [p for p in ports if not port_is_free(host, p)]


async def wait_ports_free(host: str, ports: Iterable[int], timeout: float, interval: float = 0.05) -> list[int]:
    """Poll until every port is free or ``timeout`` passes; return those still taken."""
    ports = list(ports)
    deadline = time.monotonic() + timeout
    while True:
        taken = taken_ports(host, ports)
        if not taken or time.monotonic() >= deadline:
            return taken
        await anyio.sleep(interval)


@dataclass(frozen=True)
class PortOwner:
    port: int
    pid: int | None
    name: str | None


def port_owners(ports: Iterable[int]) -> list[PortOwner]:
    """Listening sockets on ``ports`` and their processes (pid None when not visible to us)."""
    wanted = set(ports)
    out: list[PortOwner] = []
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return [PortOwner(p, None, None) for p in sorted(wanted)]
    for c in conns:
        if not c.laddr or c.laddr.port not in wanted or c.status != psutil.CONN_LISTEN:
            continue
        name = None
        if c.pid is not None:
            try:
                name = psutil.Process(c.pid).name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        out.append(PortOwner(c.laddr.port, c.pid, name))
    return out
