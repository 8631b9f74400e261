"""The one place where record field names meet the report.

Records grow fields as the project grows (estimates, checks, local-SGD measurements) and some names are
still provisional.  Every section of the report reads a *tidy* frame with short, stable column names; the
dotted record paths they come from are listed here once, so renaming a record field is a one-line change.
A column whose field no run has produced yet is still present (all missing), so sections test for data,
never for the existence of a column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..point.case import PRESETS
from ..point.setup import precision_name
from ..point.strategy import checkpointing_name

# short name -> (dotted column of store.records.to_frame, kind).  kind: num | str | bool | obj (lists, dicts).
COLUMNS: dict[str, tuple[str, str]] = {
    "case_id": ("case_id", "str"),
    "suite": ("suite", "str"),
    "status": ("status", "str"),
    "reason": ("reason", "str"),
    "stderr_tail": ("stderr_tail", "str"),
    "strategy": ("strategy", "str"),
    "model_name": ("case.model.name", "str"),
    "family": ("case.model.family", "str"),
    "hidden": ("case.model.hidden", "num"),
    "layers": ("case.model.layers", "num"),
    "heads": ("case.model.heads", "num"),
    "kv_heads": ("case.model.kv_heads", "num"),
    "intermediate": ("case.model.intermediate", "num"),
    "vocab": ("case.model.vocab", "num"),
    "dtype": ("case.model.dtype", "str"),
    "autocast": ("case.setup.autocast", "str"),  # absent on records from before mixed precision: pure
    "loop": ("case.setup.loop", "str"),  # absent on records from before the loops: manual
    "attn": ("case.model.attn", "str"),
    "attn_ran": ("measurement.attn_implementation", "str"),  # what transformers built the model with
    "dropout": ("case.model.dropout", "str"),  # absent on records from before it was a choice: off
    "dropout_ran": ("measurement.dropout", "obj"),  # the probabilities the built model's config held
    "batch": ("case.batch_size", "num"),
    "seq": ("case.seq_len", "num"),
    "every_n": ("case.every_n_layers", "num"),
    "offload": ("case.offload", "bool"),
    "K": ("case.local_sgd_steps", "num"),
    "world": ("case.world_size", "num"),
    "accum": ("case.grad_accum", "num"),
    "device": ("case.device", "str"),
    # measurement
    "after_fwd": ("measurement.mem_after_forward_bytes", "num"),
    "act_after_fwd": ("measurement.activations_after_forward_bytes", "num"),
    "peak": ("measurement.peak_bytes", "num"),
    "bd_params": ("measurement.peak_breakdown.params", "num"),
    "bd_grads": ("measurement.peak_breakdown.grads", "num"),
    "bd_optimizer": ("measurement.peak_breakdown.optimizer", "num"),
    "bd_activations": ("measurement.peak_breakdown.activations", "num"),
    "saved": ("measurement.saved_bytes", "num"),
    "ckpt_inputs": ("measurement.checkpointed_input_bytes", "num"),
    "offloaded": ("measurement.offloaded_bytes", "num"),
    "recomputed": ("measurement.recomputed_layers", "obj"),
    "step_s": ("measurement.step_time_median_s", "num"),
    "step_p90_s": ("measurement.step_time_p90_s", "num"),
    "step_cv": ("measurement.step_time_cv", "num"),
    "step_ci": ("measurement.step_time_ci95_s", "obj"),  # the median's interval (order statistics)
    "step_ci_cov": ("measurement.step_time_ci_coverage", "num"),  # the coverage that interval really has
    "timed_steps": ("measurement.timed_steps", "num"),
    "stopped_by": ("measurement.timing_stopped_by", "str"),  # precision | max_steps | max_time | fixed
    "step_times": ("measurement.step_times_s", "obj"),
    "repeat_medians": ("measurement.repeat_medians_s", "obj"),
    "threads": ("measurement.threads", "num"),
    "load_average": ("env.load_average", "str"),  # 1, 5 and 15 minutes, as the point ended
    "cpu_count": ("env.cpu_count", "num"),
    "cores_seen": ("placement.cores_seen", "obj"),
    "tok_s": ("measurement.tokens_per_s", "num"),
    "setup_s": ("measurement.setup_s", "num"),
    "losses": ("measurement.losses", "obj"),
    "offload_pinned": ("measurement.offload_pinned", "obj"),
    "offload_note": ("measurement.offload_note", "str"),
    # local SGD / DDP (provisional names)
    "comm_payload": ("measurement.comm_payload_bytes_per_step", "num"),
    "comm_bus": ("measurement.comm_bus_bytes_per_step", "num"),
    "collectives": ("measurement.collectives_per_step", "num"),
    "sync_s": ("measurement.sync_time_s", "num"),
    "loss_per_rank": ("measurement.loss_per_rank", "obj"),
    "seed": ("case.train.seed", "num"),
    "data_source": ("case.data.source", "str"),  # absent on records from before [data]: random
    "sync_impl": ("case.sync_impl", "str"),
    "eval_curve": ("measurement.eval_curve", "obj"),  # held-out loss at fixed token counts (text sources)
    "eval_loss": ("measurement.eval_loss", "num"),
    "compute_s": ("measurement.compute_time_s", "num"),  # step time less synchronisation, per optimizer step
    "comm_payload_total": ("measurement.comm_payload_bytes", "num"),
    "allreduce_count": ("measurement.allreduce_count", "num"),
    "syncs": ("measurement.syncs", "num"),
    "params_bytes": ("measurement.params_bytes", "num"),
    # analytic estimate
    "est_after_fwd": ("estimate.mem_after_forward_bytes", "num"),
    "est_act_after_fwd": ("estimate.activations_after_forward_bytes", "num"),
    "est_peak": ("estimate.peak_bytes", "num"),
    "est_ckpt_inputs": ("estimate.checkpointed_input_bytes", "num"),
    "est_offloaded": ("estimate.offloaded_bytes", "num"),
    "est_params": ("estimate.params_bytes", "num"),
    "est_optimizer": ("estimate.optimizer_bytes", "num"),
    "checks": ("checks", "obj"),
    "meter_checks": ("meters.checks", "obj"),  # the two memory meters' agreement, shown as checks "meters.<q>"
    "gates": ("gates", "obj"),  # what fails a record beside its checks, shown as checks "gate.<name>"
    "rank": ("track.rank", "num"),  # a tracked torchrun's rank (its ranks beyond 0 each a record)
    "from_step": ("track.from_step", "num"),  # a tracked run measured again: the step it began at
}

# Fields of one entry of record["checks"].
CHECK_FIELDS = ("quantity", "measured", "estimated", "ratio", "tolerance", "verdict", "difference")

# Columns of the records frame the report reads besides those of COLUMNS (env.* columns are added too).
FRAME_EXTRA = ("verdict", "finished_at")


def _missing(value) -> bool:
    if value is None:
        return True
    kind = type(value)
    if kind is str or kind is int or kind is bool or kind is list or kind is dict:  # nearly every value
        return False
    if kind is float:
        return value != value
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # lists and dicts are data, not missing
        return False


def _flat(value, prefix: str, out: dict) -> None:
    """``pd.json_normalize``'s flattening of one field: dicts into dotted leaves, anything else a leaf."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _flat(inner, f"{prefix}.{key}", out)
    else:
        out[prefix] = value


def record_frame(records: list[dict]) -> pd.DataFrame:
    """The columns of ``store.records.to_frame(records)`` the report reads (those of COLUMNS, FRAME_EXTRA
    and every env.* leaf), read straight from the records as plain Python values (object columns).

    A run of 20,000 records flattens to some 150 columns of which the report reads half; this reads
    only those.  A field of kind ``obj`` keeps a dict value (the dropout probabilities a model ran
    with), which flattening into leaves would have lost; any other dict-valued field reads as missing.
    """
    n = len(records)
    parents: dict[str, list[dict]] = {"": list(records)}

    def parent(path: str) -> list[dict]:
        got = parents.get(path)
        if got is None:
            head, _, key = path.rpartition(".")
            got = parents[path] = [(v if type(v) is dict else {}) for v in (d.get(key) for d in parent(head))]
        return got

    columns: dict[str, list] = {}
    kinds = {dotted: kind for dotted, kind in COLUMNS.values()}
    for dotted in [*kinds, *FRAME_EXTRA]:
        if dotted.startswith("env."):  # every env leaf is read below, in the order flattening gives
            continue
        head, _, key = dotted.rpartition(".")
        values = [d.get(key) for d in parent(head)]
        if kinds.get(dotted) != "obj":
            values = [None if type(v) is dict else v for v in values]
        columns[dotted] = values
    env: dict[str, list] = {}
    for i, d in enumerate(parent("env")):
        leaves: dict = {}
        for key, value in d.items():
            _flat(value, f"env.{key}", leaves)
        for key, value in leaves.items():
            column = env.get(key)
            if column is None:
                column = env[key] = [None] * n
            column[i] = value
    columns.update(env)
    return pd.DataFrame({k: pd.Series(v, dtype=object) for k, v in columns.items()}) if n else pd.DataFrame()


def named_checks(checks, meter_checks, gates=None):
    """A record's checks, then its meters' checks named ``meters.<quantity>`` and each gate that is set,
    as a failing check named ``gate.<name>`` (what its verdict counts, every one named)."""
    extra = [{**c, "quantity": f"meters.{c.get('quantity')}"} for c in meter_checks or () if isinstance(c, dict)]
    if isinstance(gates, dict):
        extra += [{"quantity": f"gate.{g}", "measured": v, "estimated": 0, "ratio": None, "tolerance": 0.0,
                   "verdict": "fail", "difference": v} for g, v in gates.items() if v]
    if not extra:
        return checks
    return (checks if isinstance(checks, list) else []) + extra


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """The records frame (:func:`record_frame`, or ``store.records.to_frame``) with the short column names
    above, typed, plus derived labels.  Text columns are plain Python strings (object dtype): a run of
    20,000 records reads them row by row many times, which pandas' Arrow strings make slow."""
    n = len(frame)
    out: dict[str, object] = {}
    for short, (dotted, kind) in COLUMNS.items():
        col = list(frame[dotted]) if dotted in frame.columns else [None] * n
        if kind == "num":
            out[short] = pd.to_numeric(pd.Series(col, dtype=object), errors="coerce").astype(float).to_numpy()
        elif kind == "str":
            out[short] = ["" if _missing(v) else str(v) for v in col]
        elif kind == "bool":
            out[short] = np.array([bool(v) if not _missing(v) else False for v in col], dtype=bool)
        else:
            out[short] = [None if _missing(v) else v for v in col]
    leaves = [c for c in frame.columns if c.startswith("gates.")]
    if "gates" not in frame.columns and leaves:  # json_normalize flattened each gate into a column of its own
        out["gates"] = [{c[len("gates."):]: v for c, v in zip(leaves, row) if not _missing(v)} or None
                        for row in zip(*(frame[c] for c in leaves))]
    # a record's verdict counts its meters' checks and its gates: the report and the CSV list them beside
    # the estimate's, so every fail names its check
    out["checks"] = [named_checks(c, m, g) for c, m, g in zip(out["checks"], out["meter_checks"], out["gates"])]
    out["attn"] = [ran or asked for ran, asked in zip(out["attn_ran"], out["attn"])]  # the attention that ran
    out["precision"] = [precision_name(dt, ac) for ac, dt in zip(out["autocast"], out["dtype"])]
    out["loop"] = [loop or "manual" for loop in out["loop"]]
    out["dropout"] = [dropout_label(ran, asked) for ran, asked in zip(out["dropout_ran"], out["dropout"])]
    out["model"] = [model_label(name, fam, dict(zip(SHAPE, dims))) for name, fam, *dims in
                    zip(out["model_name"], out["family"], *(out[k] for k in SHAPE))]
    out["strategy"] = [s or _strategy_name(n, off) for s, n, off in zip(out["strategy"], out["every_n"],
                                                                         out["offload"])]
    out["variant"] = [_variant(*row) for row in zip(out["model"], out["precision"], out["attn"], out["dropout"],
                                                    out["loop"], out["world"], out["K"], out["accum"],
                                                    out["rank"], out["from_step"])]
    out["step_ci_lo"] = [ci[0] if isinstance(ci, list) and len(ci) == 2 else float("nan") for ci in out["step_ci"]]
    out["step_ci_hi"] = [ci[1] if isinstance(ci, list) and len(ci) == 2 else float("nan") for ci in out["step_ci"]]
    out["ok"] = np.array([s == "ok" for s in out["status"]], dtype=bool)
    for key in ("step_ci_lo", "step_ci_hi"):
        out[key] = np.array(out[key], dtype=float)
    order = [*COLUMNS, "precision", "model", "variant", "ok", "step_ci_lo", "step_ci_hi"]
    return pd.DataFrame({k: (out[k] if isinstance(out[k], np.ndarray) else
                             pd.Series(out[k], index=frame.index, dtype=object)) for k in order}, index=frame.index)


SHAPE = ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab")
SHAPE_SHORT = {"hidden": "h", "layers": "l", "heads": "a", "kv_heads": "kv", "intermediate": "i", "vocab": "v"}


def model_label(name: str, family: str, dims: dict) -> str:
    """The model's name; a preset whose dimensions a suite overrode is named with what differs
    ("llama-small (h512 l8)"), so it is never compared with the preset as the same model."""
    if not name:
        return f"{family}-h{dims['hidden']:.0f}-l{dims['layers']:.0f}" if family else "?"
    base = PRESETS.get(name)
    if base is None:
        return name
    changed = [f"{SHAPE_SHORT[k]}{v:.0f}" for k, v in dims.items() if v == v and v != base[k]]  # v == v: not NaN
    return f"{name} ({' '.join(changed)})" if changed else name


def dropout_label(ran, asked: str) -> str:
    """What dropout ran: "dropout off" when every probability the model's config held was 0, else the
    largest ("dropout 0.1"); from the Case's choice on records from before the worker recorded it."""
    if isinstance(ran, dict):
        top = max(ran.values(), default=0.0)
        return f"dropout {top:g}" if top else "dropout off"
    return "dropout off" if asked in ("", "off") else f"dropout {asked}"


def no_checkpointing(strategy) -> bool:
    """A strategy name of no checkpointing: "none", or "none+bf16-mixed" and the like (the name carries
    the point's setup after a "+": ranks, precision, loop, adapters, optimizer)."""
    return str(strategy).split("+")[0] == "none"


def setup_of(strategy) -> str:
    """What a strategy name says beyond its checkpointing: "bf16-mixed+trainer+lora8" of
    "full+offload+bf16-mixed+trainer+lora8", "ddp2" of "every-2+ddp2", "" of "full+offload".  A point is
    set against no checkpointing only with this equal: LoRA's, an optimizer's or a loop's own saving is
    not checkpointing's."""
    parts = str(strategy).split("+")[1:]
    return "+".join(p for p in parts if not (p.startswith("offload") or p.startswith("sac-")))


def _strategy_name(every_n, offload) -> str:
    if _missing(every_n):
        return "?"
    return checkpointing_name(int(every_n), bool(offload))


def _variant(model, precision, attn, dropout, loop, world, k, accum, rank=None, from_step=None) -> str:
    """Everything but batch, seq and strategy: points with equal variants are comparable (a tracked
    torchrun's ranks beyond 0, and a tracked run's later measurements, are named: each is a record of its
    own)."""
    # dropout always shows: "off" is a choice the Case made (a gpt2 config publishes 0.1)
    parts = [model, precision or "?", attn or "?", dropout]
    if loop != "manual":
        parts.append(f"{loop} loop")
    if not _missing(world) and world > 1:
        parts.append(f"world {world:.0f}")
        parts.append("DDP" if not k else f"K={k:.0f}")
    if not _missing(accum) and accum > 1:
        parts.append(f"accum {accum:.0f}")
    if not _missing(rank) and rank > 0:
        parts.append(f"rank {rank:.0f}")
    if not _missing(from_step) and from_step > 0:
        parts.append(f"from step {from_step:.0f}")
    return " · ".join(parts)


def strategy_order(name: str) -> tuple:
    """none, every-n (larger n first, i.e. less checkpointing), full; then the same with offload, then
    with streamed offload."""
    base, _, extra = name.partition("+")
    if base == "none":
        rank = 0.0
    elif base == "full":
        rank = 1.0
    elif base.startswith("every-") and base[6:].isdigit():
        rank = 1.0 / int(base[6:])
    else:
        rank = 2.0
    parts = extra.split("+")
    return (2 if "offload-streamed" in parts else 1 if "offload" in parts else 0, rank, name)


def strategies(t: pd.DataFrame) -> list[str]:
    return sorted(set(t["strategy"]), key=strategy_order)


def has(t: pd.DataFrame, column: str) -> bool:
    """Whether any record carries this field."""
    return column in t.columns and t[column].notna().any()
