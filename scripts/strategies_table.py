"""Print the measured table of docs/strategies.md from a run of suites/strategies-cpu.toml
(``python scripts/strategies_table.py results/reference-strategies-cpu > table.md``): each point's memory
and step time beside its prediction (the analytic estimate, or for SAC the simulated step) and against none;
then each checkpointing point beside its offload twins (transformers' and streamed: on a CPU the same
memory); then the compiled points (torch.compile at each activation memory budget), measured only, in a table of
their own: what the compiled forward saved, the allocator meter's memory, compile time apart from the step."""

from __future__ import annotations

import sys

from ckptbench.store.records import load_records


def main(run_dir: str) -> None:
    everything = [r for r in load_records(run_dir).records if r.get("status") == "ok"]
    eager = [r for r in everything if (r["case"].get("recompute") or {}).get("compile_budget") is None]
    compiled = [r for r in everything if r not in eager]
    records = [r for r in eager if not r["case"].get("offload")]
    offloaded = [r for r in eager if r["case"].get("offload")]
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
    if offloaded:
        offload_table(offloaded, records)
    if compiled:
        compiled_table(compiled, none)


def offload_table(offloaded: list, plain: list) -> None:
    """Each checkpointing point beside its transformers' and streamed offload twins: on a CPU nothing moves,
    so each twin's peak and after-forward memory are the plain point's; their step times as measured."""
    def key(r: dict) -> tuple:
        c = r["case"]
        return c["batch_size"], c["seq_len"], c["every_n_layers"], tuple(c["recompute"].get("layers", ())), \
            c["recompute"].get("sac", "")

    twins: dict = {}
    for r in offloaded:
        twins.setdefault(key(r), {})[r["case"]["recompute"].get("offload", "") or "transformers"] = r
    print("\n| batch × seq | strategy | peak B | +offload peak B | +offload-streamed peak B | predicted B (each) "
          "| after forward equal | step s | +offload step s | +offload-streamed step s | verdicts |")
    print("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for r in sorted((r for r in plain if key(r) in twins), key=key):
        t, m = twins[key(r)], r["measurement"]
        both = [t[k] for k in ("transformers", "streamed") if k in t]
        predicted = {x.get("estimate", {}).get("peak_bytes") for x in [r, *both]}
        after = all(x["measurement"]["mem_after_forward_bytes"] == m["mem_after_forward_bytes"] for x in both)
        c = r["case"]
        print(f"| {c['batch_size']} × {c['seq_len']} | {r['strategy']} | {m['peak_bytes']:,} "
              + "".join(f"| {t[k]['measurement']['peak_bytes']:,} " if k in t else "| - "
                        for k in ("transformers", "streamed"))
              + f"| {', '.join(f'{p:,}' for p in sorted(predicted, key=lambda p: p or 0))} | {'yes' if after else 'no'} "
              f"| {m['step_time_median_s']:.3f} "
              + "".join(f"| {t[k]['measurement']['step_time_median_s']:.3f} " if k in t else "| - "
                        for k in ("transformers", "streamed"))
              + f"| {' / '.join(x['verdict'] for x in [r, *both])} |")


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
