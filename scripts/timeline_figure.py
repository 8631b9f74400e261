"""Draw docs/timeline.png: the report's memory timeline figure, from a tiny sweep run here and now.

The sweep is the suite below (an 8-layer llama-small on CPU, batch 2 × 256 tokens; none, every-2, full,
each with and without offload), run by the sweep driver as ``ckptbench sweep`` runs it, into a temporary
directory (or ``--out DIR`` to keep it).  The figure is the one the report draws for that run
(:func:`ckptbench.report.timeline.draw`), saved as PNG.  About a minute on 2 cores.

    python scripts/timeline_figure.py [--out DIR] [--png docs/timeline.png]
"""

from __future__ import annotations

import argparse
import os
import tempfile

SUITE = """
[suite]
name = "timeline-figure"
timeout_s = 300

[model]
preset = "llama-small"
layers = 8
dtype = "fp32"
attn = "sdpa"

[train]
warmup_steps = 1
memory_steps = 1
steps = 1
seed = 0
threads = 1

[sweep]
batch_size = [2]
seq_len = [256]
every_n_layers = [0, 2, 1]
offload = [false, true]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="keep the sweep's results here (default: a temporary directory)")
    parser.add_argument("--png", default=os.path.join(os.path.dirname(__file__), "..", "docs", "timeline.png"))
    args = parser.parse_args()

    from ckptbench.report.columns import record_frame, tidy
    from ckptbench.report.timeline import choose, draw
    from ckptbench.run.sweep import SweepOptions, run_sweep
    from ckptbench.store.records import load_records
    from ckptbench.store.timelines import Timelines
    from ckptbench.suite.parse import parse_suite

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        suite = parse_suite(SUITE, "timeline-figure.toml")
        run_sweep(suite, SweepOptions(out_dir=out))
        records = load_records(out).records
        groups, _ = choose(records, tidy(record_frame(records)), timelines=Timelines(out))
        if not groups:
            raise SystemExit(f"no record in {out} has a timeline: see the sweep's logs there")
        fig = draw(groups[0])
        fig.savefig(args.png, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
        sizes = {s.strategy: len(s.timeline["bytes"]) for s in groups[0].series}
        print(f"{os.path.normpath(args.png)}: {', '.join(f'{k} {v} samples' for k, v in sizes.items())}")


if __name__ == "__main__":
    main()
