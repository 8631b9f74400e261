"""``sweep --nnodes N --node-rank I --rdzv-endpoint HOST:PORT``: multi-rank points spread over hosts.

Every host runs the same sweep command with its own ``--node-rank`` (0 on the host named by the
endpoint); each multi-rank point then starts one torchrun agent per host (:mod:`ckptbench.run.nodes`),
and every host records the point in its own ``--out``.
"""

from __future__ import annotations

import argparse

from ..base.errors import UsageError
from ..run.nodes import Nodes


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a point across hosts (torchrun's c10d rendezvous)")
    g.add_argument("--nnodes", type=int, default=1, metavar="N", help="hosts each multi-rank point spans")
    g.add_argument("--node-rank", type=int, default=0, metavar="I",
                   help="this host's index, 0..N-1; node 0 hosts the rendezvous at --rdzv-endpoint")
    g.add_argument("--rdzv-endpoint", default="", metavar="HOST:PORT", help="node 0's address, reachable from all")
    g.add_argument("--local-addr", default="", metavar="ADDR",
                   help="this host's address as the others reach it (default: its hostname)")


def from_args(args: argparse.Namespace, world_sizes: list[int]) -> Nodes:
    """The layout the flags ask for, checked against the suite's multi-rank points (exit 2 if impossible)."""
    nodes = Nodes(args.nnodes, args.node_rank, args.rdzv_endpoint, args.local_addr)
    nodes.check()
    if nodes.nnodes > 1:
        if (getattr(args, "parallel", None) or 1) > 1 or len(getattr(args, "devices", None) or ()) > 1:
            raise UsageError("--nnodes runs one point at a time on every host: drop --parallel / --devices")
        for world in sorted({w for w in world_sizes if w > 1}):
            nodes.check(world)
    return nodes
