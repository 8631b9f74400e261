"""Start a multi-rank Case as a torchrun process group and turn whatever happens into a result dict.

torchrun, not ``accelerate launch``: ``accelerate launch --cpu --num_processes 2`` starts a single
process, and ``LocalSGD`` is then a silent no-op.  The group runs in its own session so a timeout can
kill every rank and torchrun's agent at once; stderr goes to a file so a crash keeps its reason.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import ckptbench

from ..point.case import Case
from ..store.files import tail
from .lifeline import CORES_VAR
from .nodes import Nodes, rendezvous_args

STDERR_TAIL_CHARS = 4000

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def free_port() -> int:
    """A port the OS just handed out (bind to 0); torchrun gets it as a fixed ``--master-port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc's parent links.

    torchrun's agent starts each rank in a session of its own, so killing torchrun's process group
    leaves the ranks running (on a GPU, holding its memory).  The tree has to be collected while
    torchrun is still alive: once it dies the ranks are re-parented and the links are gone.
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun, its agent's workers and anything they started, then reap torchrun."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def torchrun_command(case_paths: list[str], out_dir: str, world_size: int, port: int,
                     sync_impl: str, nodes: Nodes = Nodes(), run_id: str = "") -> list[str]:
    cmd = [TORCHRUN, *rendezvous_args(nodes, world_size, port, run_id), "-m", "ckptbench.run.rank",
           "--out", out_dir, "--sync-impl", sync_impl]
    for p in case_paths:
        cmd += ["--case", p]
    return cmd


def run_distributed_cases(cases: list[Case], workdir: str, timeout_s: float,
                          sync_impl: str = "accelerate", where: dict | None = None,
                          on_start: Callable[[subprocess.Popen], None] | None = None,
                          nodes: Nodes | None = None) -> list[dict]:
    """Run `cases` one after the other inside ONE torchrun group (one start-up for all).

    All cases must share ``world_size``, ``device`` and ``train.threads`` (they share the processes).
    Returns one result dict per case, shaped as :func:`run_distributed_case` documents; a crash or
    timeout marks the cases without a result file.  `where` is the sweep's slot for the group (cores
    every rank is pinned to, variables such as ``CUDA_VISIBLE_DEVICES``); `on_start` is handed the
    launcher process, so a sweep running groups side by side can stop one with :func:`kill_tree`;
    `nodes` spreads the group over hosts (:mod:`.nodes`).
    """
    if not cases:
        return []
    first = cases[0]
    for c in cases:
        if (c.world_size, c.device, c.train.threads) != (first.world_size, first.device, first.train.threads):
            raise ValueError("cases run in one torchrun group must share world_size, device and threads")
        if c.world_size < 2:
            raise ValueError(f"case {c.id}: a distributed case needs world_size >= 2, got {c.world_size}")
    workdir = os.path.abspath(workdir)  # torchrun runs with workdir as its cwd: no relative paths past here
    os.makedirs(workdir, exist_ok=True)
    case_paths = []
    for c in cases:
        path = os.path.join(workdir, f"case-{c.id}.json")
        with open(path, "w") as f:
            json.dump(c.to_dict(), f)
        case_paths.append(path)
    out_dir = os.path.join(workdir, "out")
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(first.train.threads)
    # Make sure the ranks import this very package, wherever the caller runs from.
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(ckptbench.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    if first.device == "cpu":
        env["ACCELERATE_USE_CPU"] = "1"
    if where:
        env.update(where["env"])
        if where["cores"]:
            env[CORES_VAR] = ",".join(map(str, where["cores"]))
    stderr_path = os.path.join(workdir, "stderr.txt")
    cmd = torchrun_command(case_paths, out_dir, first.world_size, free_port(), sync_impl, nodes or Nodes(),
                           run_id=f"ckptbench-{first.id}")
    start = time.perf_counter()
    status, reason = "ok", ""
    with open(stderr_path, "wb") as err, open(os.path.join(workdir, "stdout.txt"), "wb") as out:
        # through the lifeline: torchrun's agent dies with the sweep, its ranks die with the agent
        proc = subprocess.Popen([sys.executable, "-m", "ckptbench.run.lifeline", *cmd], stdout=out, stderr=err,
                                env=env, cwd=workdir, start_new_session=True)
        if on_start is not None:
            on_start(proc)
        try:
            rc = proc.wait(timeout=timeout_s)
            if rc != 0:
                status, reason = "crash", f"torchrun exited with {rc}"
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            status, reason = "timeout", f"killed after {timeout_s:g} s (torchrun and every rank)"
        except BaseException:
            kill_tree(proc)  # Ctrl-C reaches only our process group, not the ranks' sessions
            raise
    wall_s = time.perf_counter() - start
    results = []
    for c in cases:
        path = os.path.join(out_dir, f"{c.id}-{sync_impl}.json")
        measurement = None
        if os.path.exists(path):
            with open(path) as f:
                measurement = json.load(f)
        if measurement is not None:
            results.append({"status": "ok", "reason": reason,
                            "stderr_tail": tail(stderr_path, STDERR_TAIL_CHARS) if reason else "",
                            "wall_s": wall_s, "measurement": measurement})
        else:
            results.append({"status": status if status != "ok" else "crash",
                            "reason": reason or "no result file written",
                            "stderr_tail": tail(stderr_path, STDERR_TAIL_CHARS),
                            "wall_s": wall_s, "measurement": {}})
    return results


def run_distributed_case(case: Case, workdir: str, timeout_s: float, sync_impl: str = "accelerate",
                         where: dict | None = None,
                         on_start: Callable[[subprocess.Popen], None] | None = None,
                         nodes: Nodes | None = None) -> dict:
    """Run one multi-rank Case under torchrun; never raises for a failed run.

    Returns ``{"status": "ok"|"timeout"|"crash", "reason": str, "stderr_tail": str, "wall_s": float,
    "measurement": {...}}`` where ``measurement`` is the JSON rank 0 wrote (``{}`` on failure).
    """
    return run_distributed_cases([case], workdir, timeout_s, sync_impl, where, on_start, nodes)[0]


def per_optimizer_step(steps: list[dict]) -> list[list[dict]]:
    """Group the per-micro-batch entries a rank wrote into optimizer steps (the last micro-batch of a
    step is the one with ``optimizer_step`` set); with no accumulation each group is one entry."""
    groups, current = [], []
    for st in steps:
        current.append(st)
        if st["optimizer_step"]:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def compute_time(timed: list[list[dict]]) -> float | None:
    """Median seconds of an optimizer step's own work: its time less what it spent synchronising (the
    averaging, or DDP's wait for its last bucket).  What a network projection adds communication to."""
    import statistics

    work = [sum(st["step_s"] - st["sync_s"] for st in g) for g in timed]
    return statistics.median(work) if work else None


def flatten_measurement(case: Case, data: dict) -> dict:
    """The rank-0 JSON in the record's common measurement shape, the full per-rank data kept beside it.

    Per step means per optimizer step (all micro-batches of it), so K (counted in micro-batches by
    accelerate), gradient accumulation and tokens per step (``case.tokens_per_step``) share one axis.
    """
    import statistics

    s = data["summary"]
    r0 = data["ranks"][0]
    steps = r0["optimizer_steps"]
    groups = per_optimizer_step(r0["steps"])
    timed = [g for g in groups if not any(st["warmup"] or st["metered"] for st in g)]
    step_times = [sum(st["step_s"] for st in g) for g in timed]
    median = statistics.median(step_times) if step_times else None

    def mean_loss(group: list[dict]) -> float:
        return sum(st["loss"] for st in group) / len(group)

    if case.local_sgd_steps:
        sync_time = s["sync_s_mean"]  # per averaging
    else:  # DDP: the backward's wait for its last bucket, per optimizer step
        waits = [sum(st["sync_s"] for st in g) for g in timed]
        sync_time = sum(waits) / len(waits) if waits else None
    return {
        "comm_payload_bytes_per_step": s["allreduce_payload_bytes_per_rank"][0] / steps,
        "comm_bus_bytes_per_step": s["bus_bytes_per_rank"][0] / steps,
        "comm_payload_bytes": s["allreduce_payload_bytes_per_rank"][0],
        "comm_payload_bytes_per_rank": s["allreduce_payload_bytes_per_rank"],
        "allreduce_count": s["allreduce_count"],
        "collectives_per_step": s["collectives_per_rank"][0] / steps,
        "collectives_per_sync": s["collectives_per_sync"],
        "syncs": s["syncs"],
        "syncs_observed": s["syncs_observed"],
        "sync_time_s": sync_time,
        "losses": [mean_loss(g) for g in groups],
        "loss_per_rank": [[mean_loss(g) for g in per_optimizer_step(r["steps"])] for r in data["ranks"]],
        "divergence_before_sync": [st["divergence"] for st in r0["steps"] if st["synced"]],
        "final_loss": s["final_loss_per_rank"][0],
        "eval_loss": s["eval_loss_per_rank"][0],
        "eval_curve": s.get("eval_curve", []),
        "data": r0.get("data"),
        "timer": r0.get("timer", "perf_counter"),
        "compute_time_s": compute_time(timed),
        "final_divergence": s["final_divergence"],
        "step_times_s": step_times,
        # a multi-rank point times the fixed [train] steps: its averaging schedule and loss curves must be
        # the same at every K, so no rank stops early (the interval is drawn when the record is read)
        "timed_steps": len(step_times), "timing_stopped_by": "fixed",
        "step_time_median_s": median,
        "tokens_per_s": case.tokens_per_step / median if median else None,
        "activations_after_forward_bytes": (r0["forward_live_bytes"] or [None])[0],
        "params_bytes": r0["param_bytes"],
        "comm_estimate": s["estimate"],
        "sync_impl": r0["sync_impl"],
        "world_size_seen": r0["world_size"],
        "distributed": data,
        # rank 0's offload facts, where its rank stated them (offload_kind_check asks for them)
        **{k: r0[k] for k in ("offload_kind", "offload_pinned", "offload_moved") if k in r0},
        **(fsdp_measurement(data) if case.setup.sharding == "fsdp" else ddp_measurement(data)),
    }


def rank_memory(data: dict) -> dict:
    """Each rank's memory on its first memory step (exact live storages on CPU), rank 0's also as the
    record's top-level memory keys; empty where the ranks measured none."""
    memory = [r["memory"][0] if r.get("memory") else {} for r in data["ranks"]]
    if not memory[0]:
        return {}
    return {
        "peak_bytes_per_rank": [m.get("peak_bytes") for m in memory],
        "peak_phase_per_rank": [m.get("peak_phase") for m in memory],
        "peak_breakdown_per_rank": [m.get("peak_breakdown") for m in memory],
        "allocator_growth_bytes_per_rank": [m.get("allocator_growth_bytes") for m in memory],
        "tracked_start_bytes_per_rank": [m.get("tracked_start_bytes") for m in memory],
        "peak_bytes": memory[0].get("peak_bytes"),
        "peak_phase": memory[0].get("peak_phase"),
        "peak_breakdown": memory[0].get("peak_breakdown"),
    }


def ddp_measurement(data: dict) -> dict:
    """A DDP or local-SGD point's memory: each rank's exact step (:func:`rank_memory`), rank 0's after-forward
    memory, and DDP's gradient buckets (one element per trainable parameter element, :mod:`ckptbench.theory.verdicts.ddp`)."""
    out = rank_memory(data)
    if out:
        r0 = data["ranks"][0]
        first = r0["memory"][0]
        out["ddp_bucket_bytes"] = r0["grad_bytes"]
        # rank 0's two meters, as a one-process record states them (theory/verdicts/meters.py, theory/verdicts/ddp.py)
        out.update({k: first.get(k) for k in ("mem_after_forward_bytes", "tracked_start_bytes",
                                              "tracked_resident_peak_bytes", "allocator_growth_bytes",
                                              "allocator_unlisted_frees_bytes")})
    return out


def fsdp_measurement(data: dict) -> dict:
    """An fsdp point's own figures: what each rank all-gathered and reduce-scattered over the run, and
    each rank's memory on the first memory step (:func:`rank_memory`)."""
    s = data["summary"]
    ranks = data["ranks"]
    memory = [r["memory"][0] if r["memory"] else {} for r in ranks]
    return {
        "allgather_payload_bytes": s["allgather_payload_bytes_per_rank"][0],
        "allgather_payload_bytes_per_rank": s["allgather_payload_bytes_per_rank"],
        "allgather_count": s["allgather_count"],
        "reduce_scatter_payload_bytes": s["reduce_scatter_payload_bytes_per_rank"][0],
        "reduce_scatter_payload_bytes_per_rank": s["reduce_scatter_payload_bytes_per_rank"],
        "reduce_scatter_count": s["reduce_scatter_count"],
        "local_params_bytes_per_rank": [r["local_param_bytes"] for r in ranks],
        "local_optimizer_bytes_per_rank": [r["local_optimizer_bytes"] for r in ranks],
        **rank_memory(data),
        # exact on CPU only: the CUDA probe sizes a DTensor by its global placeholder storage
        **({"rank_params_bytes": memory[0].get("params_bytes"),
            "rank_optimizer_bytes": memory[0].get("optimizer_bytes"),
            "peak_params_bytes": (memory[0].get("peak_breakdown") or {}).get("params")}
           if ranks[0]["memory_meter"] == "CpuMemoryProbe" else {}),
        "memory_meter": ranks[0]["memory_meter"],
    }
