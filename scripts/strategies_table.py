"""Print the measured table of docs/strategies.md from a run of suites/strategies-cpu.toml
(``python scripts/strategies_table.py results/reference-strategies-cpu > table.md``): each point's memory
and step time beside its prediction (the analytic estimate, or for SAC the simulated step) and against none;
then the compiled points (torch.compile at each activation memory budget), measured only, in a table of
their own: what the compiled forward saved, the allocator meter's memory, compile time apart from the step."""

from __future__ import annotations

import sys

from ckptbench.store.records import load_records


def main(run_dir: str) -> None:
    everything = [r for r in load_records(run_dir).records if r.get("status") == "ok"]
    records = [r for r in everything if (r["case"].get("recompute") or {}).get("compile_budget") is None]
    compiled = [r for r in everything if r not in records]
    none = {(r["case"]["batch_size"], r["case"]["seq_len"]): r for r in records if r["strategy"] == "none"}
    print("| batch × seq | strategy | after forward B | peak B | predicted peak B | source | measured − predicted B "
          "| peak phase | recomputed FLOPs | step s (median) | CV | step × none | peak × none | verdict |")
    print("|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---|")
    order = {s: k for k, s in enumerate(dict.fromkeys(r["strategy"] for r in records))}
    for r in sorted(records, key=lambda r: (r["case"]["batch_size"], r["case"]["seq_len"], order[r["strategy"]])):
        c, m, e = r["case"], r["measurement"], r.get("estimate") or {}
        base = none[(c["batch_size"], c["seq_len"])]["measurement"]
        flops = m["counted_flops"]
        total = flops["forward"] + flops["backward"] + flops["recompute"]
        predicted = e.get("peak_bytes")
        print(f"| {c['batch_size']} × {c['seq_len']} | {r['strategy']} | {m['mem_after_forward_bytes']:,} "
              f"| {m['peak_bytes']:,} | {predicted:,} | {r.get('estimate_source')} "
              f"| {m['peak_bytes'] - predicted:+,} | {m['peak_phase']} | {flops['recompute'] / total:.1%} "
              f"| {m['step_time_median_s']:.3f} | {m['step_time_cv']:.2f} "
              f"| {m['step_time_median_s'] / base['step_time_median_s']:.2f} "
              f"| {m['peak_bytes'] / base['peak_bytes']:.2f} | {r['verdict']} |")
    if compiled:
        compiled_table(compiled, none)


def compiled_table(records: list, none: dict) -> None:
    print("\n| batch × seq | strategy | saved by the compiled forward B | after forward B | peak B | peak × none "
          "| compile s (dynamo) | first step s | graph caches | step s (median) | CV | recompiles | verdict |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for r in sorted(records, key=lambda r: (r["case"]["batch_size"], r["case"]["seq_len"],
                                            r["case"]["recompute"]["compile_budget"])):
        c, m = r["case"], r["measurement"]
        base = none[(c["batch_size"], c["seq_len"])]["measurement"]
        # inductor's FX graph and AOTAutograd caches (its per-kernel compiled code is cached on disk apart)
        hits = sum(n for k, n in m["compile_caches"].items() if k.endswith("_hit"))
        print(f"| {c['batch_size']} × {c['seq_len']} | {r['strategy']} | {m['compiled_saved_bytes']:,} "
              f"| {m['mem_after_forward_bytes']:,} | {m['peak_bytes']:,} | {m['peak_bytes'] / base['peak_bytes']:.2f} "
              f"| {m['compile_time_s']:.1f} | {m['compile_first_step_s']:.1f} | {'hit' if hits else 'miss'} "
              f"| {m['step_time_median_s']:.3f} | {m['step_time_cv']:.2f} | {m['compile_recompiles']} "
              f"| {r['verdict']} |")


if __name__ == "__main__":
    main(sys.argv[1])
