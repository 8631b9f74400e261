"""Where the ranks of a torchrun group live: one host, or several joined by torchrun's c10d rendezvous.

A point spanning hosts is the same Case (``world_size`` counts every rank) started on each host by that
host's own sweep, with the same suite and the same ``--nnodes``/``--rdzv-endpoint``; each host's
torchrun agent starts ``world_size / nnodes`` ranks and the agents meet at the endpoint, where node 0's
agent hosts the rendezvous store.  Global ranks are handed out by the rendezvous, and nothing measured
depends on which host holds which rank (rank r trains shard r of the data wherever it runs).  The
first rank on every node writes the whole gathered result, so every host's sweep records the point.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import UsageError


@dataclass(frozen=True)
class Nodes:
    nnodes: int = 1
    node_rank: int = 0  # 0 hosts the rendezvous store at the endpoint; the others connect to it
    rdzv_endpoint: str = ""  # HOST:PORT every node can reach (node 0's address)
    local_addr: str = ""  # this node's address as the others reach it ("" = torchrun's choice, its hostname)

    def check(self, world_size: int | None = None) -> None:
        """UsageError (one line) for a layout torchrun could not start."""
        if self.nnodes < 1:
            raise UsageError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise UsageError(f"--rdzv-endpoint must be HOST:PORT (node 0's address) with --nnodes "
                                 f"{self.nnodes}, got {self.rdzv_endpoint!r}")
        if world_size is not None and world_size % self.nnodes:
            raise UsageError(f"world_size {world_size} cannot be spread evenly over {self.nnodes} nodes")


def rendezvous_args(nodes: Nodes, world_size: int, port: int, run_id: str) -> list[str]:
    """torchrun's arguments for a group of `world_size` ranks laid out as `nodes`.

    One node: a fixed loopback master address and a port the OS just handed out.  Several: the c10d
    rendezvous at the endpoint under `run_id` (the Case id, the same on every host), node 0 hosting it.
    """
    if nodes.nnodes == 1:
        return ["--nnodes", "1", "--nproc-per-node", str(world_size), "--master-addr", "127.0.0.1",
                "--master-port", str(port)]
    nodes.check(world_size)
    args = ["--nnodes", str(nodes.nnodes), "--nproc-per-node", str(world_size // nodes.nnodes),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", nodes.rdzv_endpoint, "--rdzv-id", run_id,
            "--rdzv-conf", f"is_host={int(nodes.node_rank == 0)}"]
    if nodes.local_addr:
        args += ["--local-addr", nodes.local_addr]
    return args
