"""A local multi-node Ray cluster in a loopback-only network namespace, for tests and benchmarks
of the Ray backend (:mod:`perflab.lab.run.backends.ray`).

Ray advertises the host's interface address unless it cannot find one, so the cluster runs
in its own network namespace with only ``lo`` up (``unshare --net``, util-linux; root): every node is
127.0.0.1 and nothing leaves the machine. Each node is a ``ray.cluster_utils.Cluster`` node
with fake ``GPU`` resources and the ``perflab.io/sim`` label of the simulated machine it
stands for. A driver joins it from the same namespace (:meth:`NetnsCluster.argv` wraps a
command in ``nsenter --net``).

``python -m perflab.testing.raycluster a100-80g-x8:8 h100-80g-x8:8`` (the first is the head)
prints ``{"address", "nodes"}`` as one JSON line, then reads commands on stdin:
``remove I`` (kill node I's raylet and workers, as a lost machine) and ``quit`` (or EOF).
``--temp-dir=DIR``: Ray's session directories go there (:class:`NetnsCluster` makes one and
removes it with the cluster).

``--hide DIR`` (``NetnsCluster(hide=[DIR])``): the nodes do not see ``DIR`` — the cluster also
runs in its own mount namespace (``unshare --mount``, private propagation) with an empty
read-only tmpfs over ``DIR`` — while a driver joining from the host's mount namespace sees it:
a study directory there is one the nodes cannot reach, as on a cluster without a shared
filesystem (the Ray backend ships run files back, :mod:`perflab.lab.run.backends.shipping`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

# fast failure detection: a lost node is noticed within seconds, not the default half minute
SYSTEM_CONFIG = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 1000,
                 "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}
OBJECT_STORE = 80 * 2**20  # the smallest Ray accepts; events are small


def _node_args(spec: str) -> dict[str, Any]:
    from perflab.lab.run.backends.ray import SIM_LABEL

    name, _, gpus = spec.partition(":")
    return {"num_cpus": 1, "num_gpus": int(gpus or 8), "labels": {SIM_LABEL: name}, "object_store_memory": OBJECT_STORE}


def loopback_up() -> None:
    """Bring ``lo`` up in this (new, empty) network namespace: ``ip link set lo up`` without
    needing iproute2 (SIOCGIFFLAGS / SIOCSIFFLAGS, linux/sockios.h)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(sock, siocgifflags, req))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sh14x", b"lo", flags | iff_up))


def hide(directory: str) -> None:
    """An empty read-only tmpfs over ``directory``, in this (new, private) mount namespace:
    ``mount -t tmpfs -o ro,mode=0555 none DIR`` through libc's mount(2)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    ms_rdonly = 1
    if libc.mount(b"none", directory.encode(), b"tmpfs", ms_rdonly, b"mode=0555") != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs over {directory}: {os.strerror(err)}")


def main(argv: list[str]) -> None:
    from ray.cluster_utils import Cluster

    loopback_up()
    hidden = []
    for d in (a.split("=", 1)[1] for a in argv if a.startswith("--hide=")):
        try:
            hide(d)
            hidden.append(d)
        except OSError as exc:  # said in the first line: a test that needs it fails, the others run
            print(f"raycluster: {exc}", file=sys.stderr, flush=True)
    temp = next((a.split("=", 1)[1] for a in argv if a.startswith("--temp-dir=")), None)
    argv = [a for a in argv if not a.startswith(("--hide=", "--temp-dir="))]
    where: dict[str, Any] = {"temp_dir": temp} if temp else {}  # Ray's session directories (default /tmp/ray)
    if temp:
        # Cluster also writes the head's address to <default temp dir>/ray_current_cluster
        # (ray/cluster_utils.py add_node -> ray._private.utils.write_ray_address(), with no
        # temp_dir: $RAY_TMPDIR/ray, else /tmp/ray), a directory only a default-temp session
        # creates: on a machine where Ray never ran it fails with FileNotFoundError. Keep that
        # file in this cluster's own temp dir too.
        os.environ["RAY_TMPDIR"] = temp
        os.makedirs(os.path.join(temp, "ray"), exist_ok=True)

    head, *workers = argv or ["a100-80g-x8:8"]
    cluster = Cluster(initialize_head=True, head_node_args={**_node_args(head), **where, "include_dashboard": False,
                                                             "_system_config": SYSTEM_CONFIG})
    nodes: list[Any] = [cluster.head_node, *(cluster.add_node(**_node_args(w), **where) for w in workers)]
    cluster.wait_for_nodes()
    print(json.dumps({"address": cluster.address, "nodes": [n.node_id for n in nodes], "hidden": hidden}), flush=True)
    try:
        for line in sys.stdin:
            cmd, *rest = line.split()
            if cmd == "remove":
                cluster.remove_node(nodes[int(rest[0])], allow_graceful=False)
                print(json.dumps({"removed": int(rest[0])}), flush=True)
            elif cmd == "quit":
                break
    finally:
        cluster.shutdown()


class NetnsCluster:
    """``with NetnsCluster(["a100-80g-x8:8", ...]) as c:`` a cluster for the block's life."""

    def __init__(self, nodes: list[str], *, python: str = sys.executable, log: Path | None = None,
                 hide: list[Path] | None = None) -> None:
        self.nodes = nodes
        self.hide = [Path(d).resolve() for d in hide or []]
        self.hidden: list[Path] = []
        self.python = python
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.node_ids: list[str] = []
        # Ray's session directories (logs, sockets; about 1 MB a cluster), removed with the
        # cluster instead of piling up in /tmp/ray; short, for AF_UNIX's 107-byte socket paths
        self.temp_dir = tempfile.mkdtemp(prefix="plray-")

    def __enter__(self) -> NetnsCluster:
        err: IO[str] | int = open(self.log, "a") if self.log else subprocess.DEVNULL
        for mount in ([True, False] if self.hide else [False]):  # no mount namespace here: the rest still runs
            proc = self.proc = subprocess.Popen(
                ["unshare", "--net", *(["--mount"] if mount else []), self.python, "-m", "perflab.testing.raycluster",
                 *self.nodes, *(f"--hide={d}" for d in self.hide if mount), f"--temp-dir={self.temp_dir}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=self._env())
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if line:
                break
            self.proc.wait()
        else:
            raise RuntimeError(f"the Ray cluster did not start (exit {proc.returncode}; log: {self.log})")
        info = json.loads(line)
        self.address, self.node_ids = info["address"], info["nodes"]
        self.hidden = [Path(d) for d in info.get("hidden", [])]  # what the nodes really cannot see
        return self

    @staticmethod
    def _env() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cluster's network namespace."""
        assert self.proc is not None
        return ["nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--", *argv]

    def remove(self, index: int) -> None:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"remove {index}\n")
        self.proc.stdin.flush()
        self.proc.stdout.readline()

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
