"""What tracking costs a whole run, timed from outside: the same training script run as a process with and
without ``ckptbench.track``, its wall clock read by this parent, at several step sizes.

    python scripts/track_overhead_external.py [--rounds 4] [--out results/reference-track-overhead]

Each step size is a model and sequence length (llama-tiny at seq 64, llama-small at seq 128 and 1024, one
torch thread: from tens of milliseconds to about a second a step on this machine, the untracked run's
median step recorded), trained for a fixed number of steps (10-20 s of steps).  A round runs the untracked and the tracked process back to back, the order
alternating between rounds; the tracked one writes its record after its memory step and timed steps and
trains on untracked after that, as a user's run does.  Each process's wall is read around
``subprocess.run``: Python's start, imports, the model's build and every step, the tracker's memory step,
simulation, checks and record included, and nothing the tracker says about itself.  Per step size the
result is the median of the rounds' paired differences (tracked − untracked), its order-statistic interval
(:mod:`ckptbench.measure.interval`, with the coverage it has at that many rounds), and the same as a share
of the untracked run's wall.  The rows and every timing are written to ``OUT/overhead.json``.
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
SIZES = (("llama-tiny", 64, 600), ("llama-small", 128, 100), ("llama-small", 1024, 15))

CHILD = r"""
import sys, time, torch
from ckptbench.spec.case import preset
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
if out == "-":  # the untracked run says how long its steps are (what the size is, not the overhead)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(sorted(times)[len(times) // 2])
else:
    from ckptbench.track import track
    with track(model, optimizer, out=out, echo=False) as t:
        for _ in range(steps):
            with t.step(batch):
                step()
"""


def run(name: str, seq: int, steps: int, out: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(seq), str(steps), out], capture_output=True,
                          text=True, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} seq {seq}: the child failed: {proc.stderr.strip()[-500:]}")
    return wall, proc.stdout.strip()


def main(argv=None) -> int:
    from ckptbench.measure.interval import median_interval

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "reference-track-overhead"))
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, seq, steps in SIZES:
        pairs, step_times = [], []
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                order = ("plain", "tracked") if r % 2 == 0 else ("tracked", "plain")
                walls = {}
                for kind in order:
                    walls[kind], said = run(name, seq, steps, "-" if kind == "plain" else os.path.join(tmp, "rec"))
                    if kind == "plain":
                        step_times.append(float(said))
            pairs.append(walls)
        diffs = [w["tracked"] - w["plain"] for w in pairs]
        shares = [w["tracked"] / w["plain"] - 1 for w in pairs]
        interval = median_interval(diffs)
        share_interval = median_interval(shares)
        plain = statistics.median(w["plain"] for w in pairs)
        row = {"model": name, "seq": seq, "steps": steps, "rounds": args.rounds,
               "plain_wall_s": plain, "step_s": statistics.median(step_times), "difference_s": statistics.median(diffs),
               "difference_interval_s": [interval.low, interval.high], "interval_coverage": interval.coverage,
               "share": statistics.median(shares), "share_interval": [share_interval.low, share_interval.high],
               "pairs": pairs}
        rows.append(row)
        print(f"{name} seq {seq}, {steps} steps of {row['step_s'] * 1e3:.0f} ms ({plain:.1f} s untracked): tracked - untracked "
              f"{row['difference_s']:+.2f} s [{interval.low:+.2f}, {interval.high:+.2f}] "
              f"({interval.coverage:.1%} interval), {row['share']:+.1%} of the run "
              f"[{share_interval.low:+.1%}, {share_interval.high:+.1%}]", flush=True)
    with open(os.path.join(args.out, "overhead.json"), "w", encoding="utf-8") as fh:
        json.dump({"rows": rows, "machine": os.uname().nodename, "cores": os.cpu_count(),
                   "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
