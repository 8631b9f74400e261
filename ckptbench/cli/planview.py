"""What ``plan`` prints: the run it plans, and its table of strategies with the assumptions under it."""

from __future__ import annotations

SHOWN = 12  # table rows; --json has every strategy


def run_label(case) -> str:
    """The model and how it is trained: llama-8b (llama, 32 layers, bf16-mixed sdpa, Trainer loop)."""
    spec = case.model
    setup = case.setup
    loop = "" if setup.loop == "manual" else f", {setup.loop} loop"
    if setup.lora:
        targets = ",".join(setup.lora.targets) or "peft's default targets"
        loop += f", LoRA r={setup.lora.r} on {targets} (base frozen)"
    loop += f", {setup.optimizer}" if setup.optimizer != "adamw" else ""
    return f"{spec.label} ({spec.family}, {spec.layers} layers, {case.precision} {spec.attn}{loop})"


def render(case, seq: int, options, a, why_nothing: str = "") -> str:
    from ..theory.policy.plan import merged, recommendation, shown_rows

    gib = 2**30
    ranks = f" × {a.world} ranks (tokens/s of all of them)" if a.world > 1 else ""
    ranks += ", FSDP2: memory per rank" if a.sharding == "fsdp" else ""
    lines = [f"{run_label(case)} at seq {seq}, "
             f"{a.memory_bytes / gib:.2f} GiB on {a.device_name or a.device}{ranks}",
             f"{'strategy':<46} {'max batch':>9} {'max seq @b1':>11} {'batch':>5} {'peak GiB':>9} {'step s':>8}"
             f" {'interval s':>13}" + (f" {'compute':>8} {'comm':>8} {'exposed':>8}" if a.world > 1 else "")
             + f" {'tokens/s':>10}"]
    shown, rows = shown_rows(options, SHOWN), merged(options)

    def sec(x):
        return "-" if x is None else f"{x:.3f}"
    for o in shown:
        interval = f"{o.step_low_s:.3f}-{o.step_high_s:.3f}" if o.step_low_s is not None else "-"
        lines.append(f"{o.strategy:<46} {o.max_batch:>9} {'-' if o.max_seq is None else o.max_seq:>11} "
                     f"{o.batch or '-':>5} {'-' if o.peak_bytes is None else f'{o.peak_bytes / gib:.2f}':>9} "
                     f"{sec(o.step_s):>8} {interval:>13}"
                     + (f" {sec(o.compute_s):>8} {sec(o.comm_s):>8} {sec(o.exposed_s):>8}" if a.world > 1 else "")
                     + f" {'-' if o.tokens_per_s is None else f'{o.tokens_per_s:,.0f}':>10}")
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} slower or smaller rows more ({len(options)} strategies; "
                     "--json lists each)")
    lines.append(f"recommended: {why_nothing or recommendation(options, a.device)}")
    lines.append(f"step time: {a.step_time_source}" if a.step_time_source
                 else "step time: none predicted (no setting fits)")
    lines.append("assumed: " + "; ".join(
        ([f"reserved +{a.reserved_margin:.0%} and context {a.context_bytes / 2**20:.0f} MiB on the peak "
          f"({a.sources.get('reserved_margin', 'default')})"] if a.device == "cuda" else [])
        + [f"{k}: {v}" for k, v in a.sources.items() if k != "reserved_margin"] or ["nothing beyond the estimate"]))
    return "\n".join(lines)
