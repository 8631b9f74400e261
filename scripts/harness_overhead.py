"""What the harness costs beyond the training it times: ckptbench against a plain PyTorch loop.

    python scripts/harness_overhead.py [--pairs 3] [--out DIR]

The same three points (a Llama of hidden 256 × 8 layers, batch 2 × seq 512, fp32, one thread; none,
every-2 and full checkpointing through transformers' own API) run two ways, in interleaved pairs:

- ``ckptbench sweep`` of the three points, in a fresh process: the whole command's wall time;
- a plain loop in a fresh process: ``transformers`` builds the same config, checkpointing switched on as
  ckptbench switches it on, AdamW, and for each point exactly as many training steps as ckptbench ran for
  it (its record's warm-up, memory and timed steps), timed by the whole process's wall time.

The ratio of the two is the harness's cost (fork server, workers, probes, checks, records); the answer
ckptbench gives stays the one it states (each point's median to its precision target).
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

SUITE = """[suite]
name = "harness-overhead"
[model]
preset = "llama-small"
layers = 8
dtype = "fp32"
attn = "sdpa"
[train]
warmup_steps = 1
memory_steps = 1
steps = 3
threads = 1
[sweep]
batch_size = [2]
seq_len = [512]
every_n_layers = [0, 2, 1]
offload = [false]
"""

PLAIN = r"""
import json, sys, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM
t0 = time.perf_counter()
torch.set_num_threads(1)
points = json.loads(sys.argv[1])
for p in points:
    torch.manual_seed(0)
    config = AutoConfig.for_model(**p["config"])
    model = AutoModelForCausalLM.from_config(config)
    if p["every_n_layers"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for i, layer in enumerate(model.model.layers):
            layer.gradient_checkpointing = i % p["every_n_layers"] == 0
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, config.vocab_size, (p["batch"], p["seq"]))
    for _ in range(p["steps"]):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
print(json.dumps({"wall_s": time.perf_counter() - t0}))
"""


def ckptbench_run(out: str) -> tuple[float, list[dict]]:
    os.makedirs(out, exist_ok=True)
    suite = os.path.join(out, "suite.toml")
    with open(suite, "w") as fh:
        fh.write(SUITE)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", suite, "--out", os.path.join(out, "run")],
                   check=True, capture_output=True)
    wall = time.perf_counter() - t0
    with open(os.path.join(out, "run", "records.jsonl")) as fh:
        records = [json.loads(line) for line in fh]
    return wall, records


def plain_points(records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        m, c = r["measurement"], r["case"]
        keep = {k: v for k, v in m["resolved_config"].items() if k not in ("architectures", "transformers_version")}
        out.append({"config": keep, "every_n_layers": c["every_n_layers"], "batch": c["batch_size"],
                    "seq": c["seq_len"], "steps": m["steps"]["warmup"] + m["steps"]["memory"] + m["steps"]["timed"]})
    return out


def plain_run(points: list[dict]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", PLAIN, json.dumps(points)], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out", default=None, help="where the sweeps' records go (default: a temporary folder)")
    args = p.parse_args()
    base = args.out or tempfile.mkdtemp(prefix="harness-overhead-")
    rows = []
    for k in range(args.pairs):
        wall, records = ckptbench_run(os.path.join(base, f"pair-{k + 1}"))
        points = plain_points(records)
        plain = plain_run(points)
        steps = sum(x["steps"] for x in points)
        rows.append((wall, plain, steps, [r["measurement"]["step_time_median_s"] for r in records],
                     [r.get("harness_ratio") for r in records]))
        print(f"pair {k + 1}: ckptbench {wall:.1f} s, plain loop {plain:.1f} s for the same {steps} steps: "
              f"{wall / plain:.2f}x; medians {', '.join(f'{t * 1e3:.0f} ms' for t in rows[-1][3])}; "
              f"points' harness_ratio {', '.join(f'{h:.3f}' for h in rows[-1][4] if h)}", flush=True)
    ratios = [w / p for w, p, *_ in rows]
    print(f"median ratio {statistics.median(ratios):.2f}x over {len(rows)} pairs (records under {base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
