"""One torchrun rank: ``python -m ckptbench.run.rank --case case.json --out DIR [--sync-impl ...]``.

Every rank trains; all ranks' measurements are gathered (``all_gather_object``, not counted as training
traffic) and the first rank of each node writes one JSON file per case atomically (tmp, fsync, rename),
so a reader never sees half a result, a killed group leaves no file rather than a wrong one, and a group
spanning hosts leaves the same result on every host (each host's sweep records it).  Several ``--case`` flags
run several cases in the same process group, which saves one torchrun start-up (seconds) per case.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

from ..point.case import SYNC_IMPLS, Case
from ..store.files import write_json_atomic
from .lifeline import die_with_parent


def result_path(out_dir: str, case: Case, sync_impl: str) -> str:
    return os.path.join(out_dir, f"{case.id}-{sync_impl}.json")


def summarise(case: Case, ranks: list[dict], sync_impl: str) -> dict:
    """Rank-0 view plus the numbers a report plots: payload per rank, collectives per sync, losses."""
    from ..theory.comm.comm import comm_estimate

    r0 = ranks[0]
    if case.setup.sharding == "fsdp":
        return summarise_fsdp(ranks)
    timed = [s for s in r0["steps"] if not s["warmup"] and not s["metered"]]
    k = case.local_sgd_steps
    ar = r0["total"]["ops"].get("allreduce", {"count": 0, "payload_bytes": 0, "bus_bytes": 0.0})
    syncs = r0["syncs"]
    est = comm_estimate(r0["param_bytes"], r0["grad_bytes"], r0["optimizer_steps"], k, r0["world_size"],
                        grad_accum=case.grad_accum, n_param_tensors=r0["n_param_tensors"],
                        sync_impl=sync_impl)
    return {
        "payload_bytes_per_rank": [r["total"]["payload_bytes"] for r in ranks],
        "allreduce_payload_bytes_per_rank": [r["total"]["ops"].get("allreduce", {}).get("payload_bytes", 0)
                                             for r in ranks],
        "bus_bytes_per_rank": [r["total"]["bus_bytes"] for r in ranks],
        "collectives_per_rank": [r["total"]["collectives"] for r in ranks],
        "allreduce_count": ar["count"],
        "syncs": syncs,
        "syncs_observed": r0["syncs_observed"],
        "collectives_per_sync": (sum(s["collectives"] for s in r0["steps"] if s["synced"])
                                 + r0["exit"]["collectives"]) / syncs if syncs else None,
        "sync_s_mean": sum(r0["sync_s"]) / len(r0["sync_s"]) if r0["sync_s"] else None,
        "ddp_wait_s_mean": (sum(s["sync_s"] for s in timed) / len(timed)) if k == 0 and timed else None,
        "step_s_mean": sum(s["step_s"] for s in timed) / len(timed) if timed else None,
        "timed_iterations": len(timed),
        "final_loss_per_rank": [r["final_loss"] for r in ranks],
        "eval_loss_per_rank": [r["eval_loss"] for r in ranks],
        "eval_curve": r0.get("eval_curve", []),
        "final_divergence": max(r["final_divergence"] for r in ranks),
        "estimate": est,
        "estimate_matches": est["allreduce_payload_bytes"] == ar["payload_bytes"],
    }


def summarise_fsdp(ranks: list[dict]) -> dict:
    """An fsdp point's collectives per rank (all-gather and reduce-scatter payloads), memory and losses;
    the formula meets them in the record's checks, not here."""
    r0 = ranks[0]
    timed = [s for s in r0["steps"] if not s["warmup"] and not s["metered"]]

    def op_bytes(rank: dict, op: str) -> int:
        return rank["total"]["ops"].get(op, {}).get("payload_bytes", 0)

    return {
        "payload_bytes_per_rank": [r["total"]["payload_bytes"] for r in ranks],
        "allgather_payload_bytes_per_rank": [op_bytes(r, "_allgather_base") for r in ranks],
        "reduce_scatter_payload_bytes_per_rank": [op_bytes(r, "_reduce_scatter_base") for r in ranks],
        "allreduce_payload_bytes_per_rank": [op_bytes(r, "allreduce") for r in ranks],
        "bus_bytes_per_rank": [r["total"]["bus_bytes"] for r in ranks],
        "collectives_per_rank": [r["total"]["collectives"] for r in ranks],
        "allgather_count": r0["total"]["ops"].get("_allgather_base", {}).get("count", 0),
        "reduce_scatter_count": r0["total"]["ops"].get("_reduce_scatter_base", {}).get("count", 0),
        "allreduce_count": r0["total"]["ops"].get("allreduce", {}).get("count", 0),
        "peak_bytes_per_rank": [r["memory"][0]["peak_bytes"] if r["memory"] else None for r in ranks],
        "syncs": 0,
        "syncs_observed": 0,
        "collectives_per_sync": None,
        "sync_s_mean": None,
        "step_s_mean": sum(s["step_s"] for s in timed) / len(timed) if timed else None,
        "timed_iterations": len(timed),
        "final_loss_per_rank": [r["final_loss"] for r in ranks],
        "eval_loss_per_rank": [r["eval_loss"] for r in ranks],
        "eval_curve": [],
        "final_divergence": 0.0,
        "estimate": None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptbench.run.rank", description=__doc__)
    parser.add_argument("--case", action="append", required=True, help="Case JSON file (repeatable)")
    parser.add_argument("--out", required=True, help="directory for <case_id>-<sync_impl>.json")
    parser.add_argument("--sync-impl", default="accelerate", choices=SYNC_IMPLS)
    args = parser.parse_args(argv)
    die_with_parent()  # a rank must never outlive torchrun's agent

    import torch
    import torch.distributed as dist

    from ..train.checkpointing import offload_for
    from ..train.fsdp import train_rank_fsdp
    from ..train.localsgd import train_rank

    cases = []
    for path in args.case:
        with open(path) as f:
            cases.append(Case.from_dict(json.load(f)))
    for case in cases:
        torch.set_num_threads(case.train.threads)
        # without a pinned allocator (a CPU-only torch) transformers' offload runs unpinned, as on one
        # process (else save_on_cpu(pin_memory=True) fails on the first checkpointed layer)
        with offload_for(case) as offload_facts:
            data = train_rank_fsdp(case) if case.setup.sharding == "fsdp" else train_rank(case, args.sync_impl)
        # which offload ran, pinned or not, whether anything left the device: as a single process states them
        data.update({k: offload_facts[k] for k in ("offload_kind", "offload_pinned", "offload_moved")})
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, data)
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            os.makedirs(args.out, exist_ok=True)
            import accelerate
            import transformers

            write_json_atomic(result_path(args.out, case, args.sync_impl), {
                "schema": 1,
                "case_id": case.id,
                "case": case.to_dict(),
                "sync_impl": args.sync_impl,
                "summary": summarise(case, gathered, args.sync_impl),
                "ranks": gathered,
                "env": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "accelerate": accelerate.__version__, "python": sys.version.split()[0]},
            })
        _reset_accelerate()
        # the next point starts from this one's memory given back on every rank (its model, optimizer and
        # gloo's work objects are collected here, not in the middle of the next point's measured step)
        del data, gathered
        gc.collect()
        dist.barrier()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _reset_accelerate() -> None:
    """Forget accelerate's process-wide singletons so the next case's Accelerator can differ
    (e.g. in ``gradient_accumulation_steps``); the process group itself is kept and reused."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


if __name__ == "__main__":
    sys.exit(main())
