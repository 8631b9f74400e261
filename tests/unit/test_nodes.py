"""torchrun's command line for one host and for a group spread over hosts."""

import pytest

from ckptbench.base.errors import UsageError
from ckptbench.run.nodes import Nodes, rendezvous_args


def test_one_node_keeps_a_loopback_master():
    assert rendezvous_args(Nodes(), 2, 29555, "x") == ["--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
                                                        "127.0.0.1", "--master-port", "29555"]


def test_two_nodes_meet_at_the_c10d_endpoint_node_zero_hosts():
    args = rendezvous_args(Nodes(nnodes=2, node_rank=1, rdzv_endpoint="head:29400", local_addr="10.0.0.2"), 4,
                           0, "ckptbench-abc")
    assert args == ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    "head:29400", "--rdzv-id", "ckptbench-abc", "--rdzv-conf", "is_host=0", "--local-addr", "10.0.0.2"]
    assert "is_host=1" in rendezvous_args(Nodes(nnodes=2, rdzv_endpoint="head:29400"), 2, 0, "r")


@pytest.mark.parametrize("nodes, world, message", [
    (Nodes(nnodes=2, rdzv_endpoint=""), 2, "--rdzv-endpoint must be HOST:PORT"),
    (Nodes(nnodes=2, rdzv_endpoint="head"), 2, "--rdzv-endpoint must be HOST:PORT"),
    (Nodes(nnodes=2, node_rank=2, rdzv_endpoint="head:1"), 2, "--node-rank must be in 0..1"),
    (Nodes(nnodes=2, rdzv_endpoint="head:1"), 3, "world_size 3 cannot be spread evenly over 2 nodes"),
    (Nodes(nnodes=0), 2, "--nnodes must be >= 1"),
])
def test_layouts_torchrun_could_not_start_are_refused(nodes, world, message):
    with pytest.raises(UsageError, match=message):
        nodes.check(world)
