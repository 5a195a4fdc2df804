"""The rendezvous of a simulated multi-node engine: one process per node rank.

A real multi-node engine's ranks meet through PyTorch's c10d store on rank 0's address
(SGLang's ``--dist-init-addr HOST:PORT``, vLLM's ``--data-parallel-address``/``-rpc-port``):
rank 0 listens, every other rank connects, and rank 0 serves only once all have joined. The
stand-ins do the same over one TCP connection per joined rank:

* a joining rank connects (retrying until ``rendezvous_timeout_s``) and sends ``join <rank>``;
* rank 0 waits for ``nnodes - 1`` joins, then serves HTTP; it sends ``completed <n>`` lines (its
  finished requests) to the joined ranks, which is how a fault counted in requests
  (``crash-after:N`` on rank 1) strikes a rank that serves nothing;
* a closed connection is a dead peer: rank 0 fails when a joined rank is gone (a real group
  dies in its next collective), a joined rank fails when rank 0 is gone.

The failure texts are PyTorch's (torch/csrc/distributed/c10d/TCPStore.cpp, socket.cpp, and
gloo's transport/tcp/pair.cc), unless the front end sets the engine's own in
:class:`perflab_sim.config.EngineBehaviour`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

# torch/csrc/distributed/c10d/TCPStore.cpp (TCPStoreMasterDaemon / waitForWorkers): the store
# server gives up with this once its timeout passes
RENDEZVOUS_TIMEOUT_LINES = (
    "torch.distributed.DistStoreError: Timed out after {timeout_s:g} seconds waiting for clients. "
    "{joined}/{expected} clients joined.",
)
# torch/csrc/distributed/c10d/socket.cpp: a client that never reached the store's address
JOIN_TIMEOUT_LINES = (
    "torch.distributed.DistNetworkError: The client socket has timed out after {timeout_ms}ms while trying to "
    "connect to ({host}, {port}).",
)
# gloo/transport/tcp/pair.cc: the peer of a collective closed its connection
PEER_LOST_LINES = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [{host}]:{port}",
)
RETRY_S = 0.1
# real seconds between a peer's connection ending and this rank failing (its next collective)
PEER_LOST_DELAY_S = 1.0
PROGRESS_S = 0.05  # how often rank 0 tells the joined ranks its finished requests


class Rendezvous:
    """Rank 0's side: the joined ranks' connections."""

    def __init__(self, host: str, port: int, expected: int) -> None:
        self.host, self.port, self.expected = host, port, expected
        self.peers: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.server: asyncio.AbstractServer | None = None
        self._joined = asyncio.Event()
        self.lost: asyncio.Future[int] | None = None

    async def open(self) -> None:
        self.lost = asyncio.get_running_loop().create_future()
        self.server = await asyncio.start_server(self._accept, self.host, self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
        except (ConnectionError, OSError):
            writer.close()
            return
        parts = line.decode(errors="replace").split()
        if len(parts) != 2 or parts[0] != "join" or not parts[1].isdigit():
            writer.close()
            return
        rank = int(parts[1])
        self.peers[rank] = (reader, writer)
        if len(self.peers) >= self.expected:
            self._joined.set()
        # the connection stays open: its end is the peer's death
        with contextlib.suppress(ConnectionError, OSError):
            await reader.read()
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(rank)

    async def wait_joined(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._joined.wait(), timeout_s)
        return self._joined.is_set()

    async def report(self, completed: Callable[[], int]) -> None:
        """Tell the joined ranks rank 0's finished requests, whenever the count changes."""
        last = -1
        while True:
            n = completed()
            if n != last:
                last = n
                for _, writer in list(self.peers.values()):
                    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                        writer.write(f"completed {n}\n".encode())
            await asyncio.sleep(PROGRESS_S)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for _, writer in self.peers.values():
            with contextlib.suppress(Exception):
                writer.close()


async def join(host: str, port: int, rank: int, timeout_s: float,
               stop: asyncio.Event) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A joining rank's side: connect to rank 0 (retrying) and say who it is; None on timeout
    or when stopped."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_S)
            continue
        writer.write(f"join {rank}\n".encode())
        await writer.drain()
        return reader, writer
    return None


async def follow(reader: asyncio.StreamReader, on_completed: Callable[[int], None]) -> None:
    """A joined rank: read rank 0's progress until its connection ends (returns then)."""
    while True:
        try:
            line = await reader.readline()
        except (ConnectionError, OSError):
            return
        if not line:
            return
        parts = line.decode(errors="replace").split()
        if len(parts) == 2 and parts[0] == "completed" and parts[1].isdigit():
            on_completed(int(parts[1]))
