"""What tracking costs a run, timed from outside the tracker: the same training script run as a process with
and without ``ckptbench.track``, at several step sizes.

    python scripts/track_overhead_external.py [--rounds 6] [--out results/reference-track-overhead]

Each step size is a model and sequence length (llama-tiny at seq 64, llama-small at seq 128 and 512, one
torch thread, every-2 checkpointing, AdamW), trained for a fixed number of steps.  A round runs the untracked
and the tracked process back to back, the order alternating between rounds; the tracked one writes its
record after its memory step and timed steps and trains on untracked after that, as a user's run does.

Two figures per round, neither from the tracker's own clock:

- **fixed cost**, from the script's clock (the user's side of each call): importing ``ckptbench.track``,
  making the tracker and closing it, plus the time the tracked process's first W steps (W: the steps until
  its record was written, the memory step's simulation, checks and record inside the last of them) took
  beyond its own later steps' median, minus the same excess of the untracked process's first W steps over
  its own later median (a run's first steps are slower tracked or not);
- **after the record**: the tracked process's later steps' median against the untracked one's (the hooks
  are gone: what is left per step);
- and, as before, each process's whole wall read by this parent around ``subprocess.run`` (start,
  imports, build, every step), whose round-to-round spread is larger than the cost.

Per step size: the median over rounds with its order-statistic interval (:mod:`ckptbench.measure.interval`,
with the coverage it has at that many rounds).  Everything is written to ``OUT/overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (("llama-tiny", 64, 200), ("llama-small", 128, 120), ("llama-small", 512, 50))

CHILD = r"""
import json, sys, time, torch
from ckptbench.point.case import preset
from ckptbench.train.models import build_model, synthetic_batch
name, seq, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
torch.manual_seed(0)
model = build_model(preset(name))
model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = synthetic_batch(model.config.vocab_size, 1, seq, 0)
def step():
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
said = {"steps": [], "import_s": 0.0, "make_s": 0.0, "close_s": 0.0, "window": None}
times = said["steps"]
if out == "-":
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
else:
    t0 = time.perf_counter()
    from ckptbench.track import track
    t1 = time.perf_counter()
    t = track(model, optimizer, out=out, echo=False)
    said["import_s"], said["make_s"] = t1 - t0, time.perf_counter() - t1
    for k in range(steps):
        t0 = time.perf_counter()
        with t.step(batch):
            step()
        times.append(time.perf_counter() - t0)
        if said["window"] is None and t.record is not None:
            said["window"] = k + 1
    t0 = time.perf_counter()
    t.close()
    said["close_s"] = time.perf_counter() - t0
    said["status"] = t.record["status"] if t.record else None
print(json.dumps(said))
"""


def run(name: str, seq: int, steps: int, out: str) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(seq), str(steps), out], capture_output=True,
                          text=True, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} seq {seq}: the child failed: {proc.stderr.strip()[-500:]}")
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])


def fixed_cost(tracked: dict, plain: dict) -> tuple[float, float]:
    """(fixed cost s, after-the-record per-step difference s) of one round (see the module's text)."""
    w = tracked["window"]
    t_steps, p_steps = tracked["steps"], plain["steps"]
    if w is None or len(t_steps) - w < 10:
        raise SystemExit(f"the tracked run wrote its record after {w} of {len(t_steps)} steps: too few after it")
    t_later, p_later = statistics.median(t_steps[w:]), statistics.median(p_steps[w:])
    excess = sum(x - t_later for x in t_steps[:w]) - sum(x - p_later for x in p_steps[:w])
    return tracked["import_s"] + tracked["make_s"] + tracked["close_s"] + excess, t_later - p_later


def summary(values: list[float]) -> dict:
    from ckptbench.measure.interval import median_interval

    interval = median_interval(values)
    return {"median": statistics.median(values), "interval": [interval.low, interval.high],
            "coverage": interval.coverage}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "reference-track-overhead"))
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, seq, steps in SIZES:
        rounds = []
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                order = ("plain", "tracked") if r % 2 == 0 else ("tracked", "plain")
                said, walls = {}, {}
                for kind in order:
                    walls[kind], said[kind] = run(name, seq, steps, "-" if kind == "plain" else os.path.join(tmp, "rec"))
            cost, later = fixed_cost(said["tracked"], said["plain"])
            rounds.append({"walls": walls, "fixed_cost_s": cost, "later_step_difference_s": later,
                           "window": said["tracked"]["window"], "status": said["tracked"]["status"],
                           "tracked": said["tracked"], "plain": said["plain"]})
        plain_wall = statistics.median(r["walls"]["plain"] for r in rounds)
        step_s = statistics.median(statistics.median(r["plain"]["steps"]) for r in rounds)
        row = {"model": name, "seq": seq, "steps": steps, "rounds": args.rounds, "plain_wall_s": plain_wall,
               "step_s": step_s, "window_steps": [r["window"] for r in rounds],
               "fixed_cost_s": summary([r["fixed_cost_s"] for r in rounds]),
               "later_step_difference_s": summary([r["later_step_difference_s"] for r in rounds]),
               "wall_difference_s": summary([r["walls"]["tracked"] - r["walls"]["plain"] for r in rounds]),
               "rounds_detail": rounds}
        rows.append(row)
        fc, ls, wd = row["fixed_cost_s"], row["later_step_difference_s"], row["wall_difference_s"]
        print(f"{name} seq {seq}, {steps} steps of {step_s * 1e3:.0f} ms: fixed cost {fc['median']:.2f} s "
              f"[{fc['interval'][0]:.2f}, {fc['interval'][1]:.2f}] ({fc['coverage']:.1%}); after the record "
              f"{ls['median'] * 1e3:+.2f} ms a step [{ls['interval'][0] * 1e3:+.2f}, {ls['interval'][1] * 1e3:+.2f}]; "
              f"whole wall {wd['median']:+.2f} s [{wd['interval'][0]:+.2f}, {wd['interval'][1]:+.2f}]", flush=True)
    with open(os.path.join(args.out, "overhead.json"), "w", encoding="utf-8") as fh:
        json.dump({"rows": rows, "machine": os.uname().nodename, "cores": os.cpu_count(),
                   "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
