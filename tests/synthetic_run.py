"""A synthetic but valid results directory of any size, for tests and measurements of scale.

The records are copies of the committed reference run (``results/reference-cpu``), each template once
per seed, so every Case id is a real, distinct hash; measured figures are scaled a little per
point, a few checks fail, and a few points end oom or crashed, so each section of the report has
something to show.  Every record passes :func:`ckptbench.store.validate.record_problem`.  With
``--timelines`` each ok point also has a memory timeline at its 2,000-sample bound in
``timelines.jsonl``, as a sweep writes it (the record keeps the pointer).

    python -m tests.synthetic_run OUT_DIR [N] [--seed S] [--timelines] [--template RUN_DIR] [--vary seq|batch|variant]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil

from ckptbench.point.case import Case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "results", "reference-cpu")
# one llama-tiny point of one step: the suite of a results directory that tests plant records and files in
ONE_POINT_SUITE = """
[suite]
name = "one"

[model]
preset = "llama-tiny"
attn = "eager"

[train]
warmup_steps = 1
memory_steps = 1
steps = 1

[sweep]
batch_size = [1]
seq_len = [16]
every_n_layers = [0]
"""


def _templates() -> list[str]:
    with open(os.path.join(REFERENCE, "records.jsonl"), encoding="utf-8") as fh:
        return [line for line in fh if line.strip()]


def _scale_measurement(m: dict, factor: float, rng: random.Random) -> None:
    for key, value in list(m.items()):
        if key.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
            m[key] = int(value * factor)
    times = [t * factor * rng.uniform(0.9, 1.1) for t in m.get("step_times_s") or []]
    if times:
        m["step_times_s"] = times
        ordered = sorted(times)
        m["step_time_median_s"] = ordered[len(ordered) // 2]
        m["step_time_p90_s"] = ordered[-1]
        m["step_time_mean_s"] = sum(times) / len(times)
    if m.get("tokens_per_s"):
        m["tokens_per_s"] = m["tokens_per_s"] / factor


VARY = {  # a sweep's shape: what differs from point to point beyond the template's own axes
    "": lambda case, k: None,
    "seq": lambda case, k: case.update(seq_len=16 + k),  # a finely stepped long-sequence sweep
    "batch": lambda case, k: case.update(batch_size=1 + k),
    "variant": lambda case, k: case["model"].update(hidden=64 + 8 * k),  # a model variant per point
}


def synthetic_records(n: int, seed: int = 0, fail_every: int = 97, bad_every: int = 211,
                      vary: str = "") -> list[dict]:
    """`n` records with distinct Case ids; every `fail_every`-th has a failing peak check, every
    `bad_every`-th ended oom or crashed; with `vary` (:data:`VARY`) each a distinct sequence length, batch
    or model variant."""
    rng = random.Random(seed)
    templates = _templates()
    out, seen = [], set()
    i = 0
    while len(out) < n:
        t = templates[i % len(templates)]
        rec = json.loads(t)  # a fresh copy, faster than deepcopy
        case = rec["case"]
        case["train"]["seed"] = i // len(templates)  # the templates' own points, once per seed
        i += 1
        VARY[vary](case, len(out))
        cid = Case.from_dict(case).id
        if cid in seen:
            continue
        seen.add(cid)
        rec["case_id"] = cid
        k = len(out)
        factor = rng.uniform(0.9, 1.1)
        _scale_measurement(rec.get("measurement") or {}, factor, rng)
        if k % fail_every == fail_every - 1:
            for check in rec.get("checks") or []:
                if check.get("quantity") == "peak_bytes":
                    check.update(verdict="fail", ratio=1.21, difference=int((check.get("estimated") or 0) * 0.21))
            rec["verdict"] = "fail"
        if k % bad_every == bad_every - 1:
            rec["status"] = "oom" if k % 2 else "crash"
            rec["reason"] = "synthetic failure for scale tests"
            rec["stderr_tail"] = "Traceback (most recent call last):\n  ...\nRuntimeError: synthetic\n"
            rec.pop("checks", None)
            rec["verdict"] = None
        out.append(rec)
    return out


def synthetic_timeline(peak: int, samples: int = 2000) -> dict:
    """A memory timeline at the bound a sweep keeps (a step of twice as many changes, downsampled), with
    the marks of a 4-layer step, peaking at `peak` in backward."""
    top = samples * 2 // 3
    values = [peak * min(k, 2 * top - k) // top for k in range(samples)]
    marks = [[0, "forward"]] + [[40 * i + 1, f"forward-layer-{i}"] for i in range(4)]
    marks += [[2 * top - 2, "backward-head"], [2 * top, "backward-layer-3"], [2 * samples - 20, "optimizer"]]
    return {"meter": "cpu-live-storages", "unit": "bytes", "events": 2 * samples - 1,
            "event": list(range(0, 2 * samples, 2)), "bytes": values, "peak_event": 2 * top,
            "marks": marks, "marks_dropped": 0, "max_samples": samples}


def write_run(out_dir: str, n: int, seed: int = 0, timelines: bool = False, vary: str = "") -> str:
    """Write `n` synthetic records (and the reference suite file) into `out_dir`, with `timelines` a
    timeline line per ok record beside them; returns the directory."""
    os.makedirs(out_dir, exist_ok=True)
    side = open(os.path.join(out_dir, "timelines.jsonl"), "w", encoding="utf-8") if timelines else None
    with open(os.path.join(out_dir, "records.jsonl"), "w", encoding="utf-8") as fh:
        for rec in synthetic_records(n, seed, vary=vary):
            m = rec.get("measurement") or {}
            if side is not None and rec["status"] == "ok" and m.get("peak_bytes"):
                tl = synthetic_timeline(m["peak_bytes"])
                m.update(timeline_stored="timelines.jsonl", timeline_samples=len(tl["bytes"]))
                side.write(json.dumps({"attempt": 1, "case_id": rec["case_id"], "repeat": rec.get("repeat", 0),
                                       "schema": 1, "timeline": tl}, sort_keys=True) + "\n")
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
    if side is not None:
        side.close()
    suite = os.path.join(REFERENCE, "suite.toml")
    if os.path.exists(suite):
        shutil.copy(suite, os.path.join(out_dir, "suite.toml"))
    return out_dir


def main() -> None:
    global REFERENCE
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("n", type=int, nargs="?", default=20000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timelines", action="store_true", help="a memory timeline per ok point in timelines.jsonl")
    p.add_argument("--template", default=REFERENCE,
                   help="the run whose records are copied (results/reference-cpu-timed: records with up to "
                        "50 step times and losses each, about 13 KB)")
    p.add_argument("--vary", choices=sorted(VARY), default="",
                   help="each point a distinct sequence length, batch or model variant (a sweep's shape)")
    args = p.parse_args()
    REFERENCE = args.template
    print(write_run(args.out, args.n, args.seed, args.timelines, args.vary))


if __name__ == "__main__":
    main()
