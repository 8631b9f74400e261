"""Print docs/estimate.md's accuracy table: simulated (= CPU-measured) peak / estimated peak, min…max.

    python scripts/estimate_accuracy.py [RESULTS_DIR ...]

The grid crosses family × dtype × attention (rows) with strategy none / every-2 / full, batch 1, 4, 8 and
sequence 64, 256, 1024, 4096 (the tiny presets, 4 layers).  Results directories given on the command
line add a column of real CPU measurements (their records' peak / estimate).
"""

from __future__ import annotations

import itertools
import sys
from collections import defaultdict

from ckptbench.point.case import preset
from ckptbench.store.records import load_records
from ckptbench.theory.memory.estimate import estimate
from ckptbench.theory.memory.simulate import simulate

FAMILIES = ("llama", "qwen2", "gpt2")
DTYPES = ("fp32", "bf16")
ATTNS = ("eager", "sdpa")


def grid() -> dict[tuple, list[float]]:
    out = defaultdict(list)
    for fam, dtype, attn in itertools.product(FAMILIES, DTYPES, ATTNS):
        spec = preset(f"{fam}-tiny", dtype=dtype, attn=attn, max_positions=4096)
        for n, b, s in itertools.product((0, 2, 1), (1, 4, 8), (64, 256, 1024, 4096)):
            if b * s > 16384:
                continue
            out[(fam, dtype, attn)].append(simulate(spec, b, s, n).peak_bytes / estimate(spec, b, s, n).peak_bytes)
        print(f"{fam} {dtype} {attn}: {len(out[(fam, dtype, attn)])} points", file=sys.stderr, flush=True)
    return out


def measured(run_dirs: list[str]) -> dict[tuple, list[float]]:
    out = defaultdict(list)
    for run in run_dirs:
        for r in load_records(run).records:
            m, e, c = r.get("measurement") or {}, r.get("estimate") or {}, r["case"]
            if r.get("status") == "ok" and m.get("peak_bytes") and e.get("peak_bytes") and c["world_size"] == 1:
                key = (c["model"]["family"], c["model"]["dtype"], c["model"]["attn"])
                out[key].append(m["peak_bytes"] / e["peak_bytes"])
    return out


def span(values: list[float]) -> str:
    return f"{min(values):.4f} … {max(values):.4f} ({len(values)})" if values else "–"


def main() -> int:
    sim, real = grid(), measured(sys.argv[1:])
    print("| family | dtype | attention | simulated / estimate (points) | measured / estimate (points) |")
    print("| --- | --- | --- | --- | --- |")
    for key in itertools.product(FAMILIES, DTYPES, ATTNS):
        print(f"| {' | '.join(key)} | {span(sim[key])} | {span(real[key])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
