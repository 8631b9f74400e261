"""The memory timeline section: live bytes over the memory step, side by side for none, checkpointing and
offload at one point of each model variant, and the bytes each decoder layer keeps for backward.

A record's timeline (``ckptbench.measure.timeline``: parallel lists ``event`` and ``bytes``, marks as
``[event, label]``) is kept in ``timelines.jsonl`` beside the records (``measurement.timeline_stored``),
or, in runs written before that file, in ``measurement.timeline`` itself; the per-layer saved bytes are
in the measurement.  :class:`~ckptbench.store.timelines.Timelines` reads only the lines of the points
chosen here and checks each in full: a timeline that cannot be used is passed over (the next candidate
of its role is tried) and named in the section's note.  Records from before timelines are not drawn,
and the section is left out when no record has a timeline.  Only a few figures are drawn (the largest
batch × seq point of each variant, at most :data:`MAX_FIGURES`), so the report stays small whatever the
sweep's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import pandas as pd

from ..store.schema import Measurement
from ..store.timelines import TIMELINES, Timelines, has_stored_timeline
from .figures import STYLE, Figure, _encode

MAX_FIGURES = 4
MAX_FAILED = 50  # timelines that could not be read before the section stops looking (a hostile file)
GIB, MIB = 2**30, 2**20
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}
TICKS = (("forward-layer-", "#4c72b0", 0.06), ("backward-layer-", "#dd8452", 0.06),
         ("recompute-layer-", "#c44e52", 0.12))


@dataclass
class Series:
    strategy: str
    measurement: Measurement
    timeline: dict


@dataclass
class Group:
    variant: str
    batch: int
    seq: int
    series: list[Series] = field(default_factory=list)


def choose(records: list[dict], t: pd.DataFrame, max_figures: int = MAX_FIGURES,
           timelines: Timelines | None = None) -> tuple[list[Group], int]:
    """The groups to draw and how many variants were left out: per variant, the largest batch × seq
    point with a timeline that reads, and there none, the most checkpointed setting and an offloaded
    one.  Timelines are read from `timelines` (inline ones only, without it) as the groups are filled,
    so only the few drawn, and those that failed to read, are ever parsed."""
    timelines = timelines if timelines is not None else Timelines(None)
    rows: dict[tuple, dict[str, tuple]] = {}
    for record, row in zip(records, t.itertuples(index=False)):
        if not row.ok or not has_stored_timeline(record):
            continue
        key = (row.variant, int(row.batch), int(row.seq))
        every_n = 0 if row.every_n != row.every_n else int(row.every_n)
        rows.setdefault(key, {}).setdefault(row.strategy, (every_n, bool(row.offload), []))[2].append(record)
    sizes: dict[str, list[tuple]] = {}
    for variant, batch, seq in rows:
        sizes.setdefault(variant, []).append((batch * seq, seq, batch))
    failed = [0]

    def first_drawable(candidates: list[dict]) -> tuple[dict, dict] | None:
        for record in candidates:
            if failed[0] >= MAX_FAILED:
                return None
            tl = timelines.get(record)
            if tl is not None:
                return record, tl
            failed[0] += 1
        return None

    groups: list[Group] = []
    variants = sorted(sizes)
    for done, variant in enumerate(variants):
        if len(groups) >= max_figures:
            return groups, len(variants) - done
        for _, seq, batch in sorted(sizes[variant], reverse=True):
            group = Group(variant, batch, seq)
            found = rows[(variant, batch, seq)]
            none = [s for s, (n, off, _) in found.items() if n == 0 and not off]
            ckpt = [s for _, s in sorted((n, s) for s, (n, off, _) in found.items() if n > 0 and not off)]
            offl = [s for _, s in sorted((n, s) for s, (n, off, _) in found.items() if off)]
            for role in (none, ckpt, offl):
                for strategy in role:
                    hit = first_drawable(found[strategy][2])
                    if hit is not None:
                        group.series.append(Series(strategy, Measurement.read(hit[0]["measurement"]), hit[1]))
                        break
            if group.series:
                groups.append(group)
                break
    if failed[0] >= MAX_FAILED:
        timelines.problems.append(f"stopped looking after {MAX_FAILED} timelines that could not be used")
    return groups, 0


def _unit(top: float) -> tuple[float, str]:
    return (GIB, "GiB") if top >= 2 * GIB else (MIB, "MiB")


def _phase(label: str) -> str | None:
    if label.startswith(("forward-layer-", "recompute-layer-")):
        return None
    if label == "forward":
        return "forward"
    if label.startswith("backward"):
        return "backward"
    return "optimizer"  # grad-clip and optimizer: the step after backward


def _bands(ax, marks: list, end: int) -> None:
    spans: list[list] = []
    for event, label in marks:
        phase = _phase(label)
        if phase is None:
            continue
        if spans and spans[-1][2] == phase:
            continue
        if spans:
            spans[-1][1] = event
        spans.append([event, end, phase])
    for lo, hi, phase in spans:
        ax.axvspan(lo, max(hi, lo + 0.5), color=PHASE_COLORS[phase], alpha=0.10, lw=0, label=f"_{phase}")


def _ticks(ax, marks: list) -> None:
    for prefix, color, height in TICKS:
        xs = [e for e, label in marks if label.startswith(prefix) and not label.endswith("-end")]
        if xs:
            ax.vlines(xs, 1 - height, 1, transform=ax.get_xaxis_transform(), color=color, lw=0.8)


def _panel(ax, s: Series, scale: float, unit: str) -> None:
    tl = s.timeline
    events, values = tl["event"], tl["bytes"]
    marks = tl.get("marks") or []
    _bands(ax, marks, events[-1])
    ax.plot(events, [v / scale for v in values], drawstyle="steps-post", lw=0.9, color="#222222", rasterized=True)
    top = max(values)
    peak_event = tl.get("peak_event", events[values.index(top)])
    ax.plot([peak_event], [top / scale], "o", color="#c44e52", ms=4)
    phase = s.measurement.peak_phase or ""
    ax.annotate(f"peak {top / scale:.3g} {unit}" + (f"\n{phase}" if phase else ""), (peak_event, top / scale),
                xytext=(4, -4), textcoords="offset points", fontsize=7, va="top")
    _ticks(ax, marks)
    ax.set_title(s.strategy)
    ax.set_xlabel("memory events")
    ax.set_xlim(0, max(events[-1], 1))


def _bars(ax, group: Group) -> None:
    n = max(len(s.measurement.saved_bytes_per_layer) for s in group.series)
    if n == 0:  # records from before the per-layer counts
        ax.text(0.5, 0.5, "no saved bytes per layer in these records", ha="center", va="center",
                transform=ax.transAxes, fontsize=8, color="#666666")
        ax.set_axis_off()
        return
    width = 0.8 / max(len(group.series), 1)
    cmap = plt.get_cmap("tab10")
    top = max([max(s.measurement.saved_bytes_per_layer or [0]) for s in group.series]
              + [s.measurement.saved_outside_layers_bytes or 0 for s in group.series])
    scale, unit = _unit(top) if top >= MIB else (2**10, "KiB")
    for k, s in enumerate(group.series):
        m = s.measurement
        per = list(m.saved_bytes_per_layer)
        if not per:
            continue
        per += [0] * (n - len(per))
        host = list(m.offloaded_bytes_per_layer or [0] * n) + [0] * n
        outside = m.saved_outside_layers_bytes or 0
        xs = [i - 0.4 + width * (k + 0.5) for i in range(n + 1)]
        device = [(v - h) / scale for v, h in zip(per, host)] + [outside / scale]
        ax.bar(xs, device, width, color=cmap(k), label=s.strategy)
        offloaded = [h / scale for h in host[:n]] + [0.0]
        if any(offloaded):
            ax.bar(xs, offloaded, width, bottom=device, color="none", edgecolor=cmap(k), hatch="///", lw=0.6,
                   label=f"{s.strategy}: on host")
    ax.set_xticks(range(n + 1), [str(i) for i in range(n)] + ["outside"])
    ax.set_xlabel("decoder layer")
    ax.set_ylabel(f"{unit} saved for backward")
    ax.legend(fontsize=7, frameon=False)


def draw(group: Group):
    """The matplotlib figure of one group: a timeline panel per setting (same y axis) above the bars."""
    tops = [max(s.timeline["bytes"]) for s in group.series]
    scale, unit = _unit(max(tops))
    k = len(group.series)
    with plt.rc_context(STYLE):
        fig = plt.figure(figsize=(max(4.2 * k, 6.0), 6.4))
        grid = fig.add_gridspec(2, k, height_ratios=(3, 2))
        first = None
        for i, s in enumerate(group.series):
            ax = fig.add_subplot(grid[0, i], sharey=first)
            first = first or ax
            _panel(ax, s, scale, unit)
            if i == 0:
                ax.set_ylabel(f"live {unit}")
        for phase, color in PHASE_COLORS.items():
            first.axvspan(0, 0, color=color, alpha=0.25, lw=0, label=phase)
        first.set_ylim(bottom=0)
        first.legend(loc="lower right", fontsize=7, frameon=False)
        _bars(fig.add_subplot(grid[1, :]), group)
        fig.suptitle(f"{group.variant} · batch {group.batch}, seq {group.seq}", fontsize=10)
    return fig


def caption(group: Group) -> str:
    meter = group.series[0].timeline.get("meter", "")
    what = ("requested bytes in the CUDA caching allocator's history" if meter.startswith("cuda")
            else "live tensor bytes counted by the CPU live-storage tracker")
    return (f"{what} after every allocation and free of the memory step (at most 2,000 samples: past that "
            "the lowest and highest of each bucket, so the maximum is the exact peak). Shaded: forward, "
            "backward, optimizer. Ticks at the top: a decoder layer's forward begins (blue), backward reaches "
            "it (orange), it is recomputed (red, tall). Bars: the bytes each decoder layer keeps for "
            "backward after the forward (hatched: offloaded to host); outside: what no layer keeps (the "
            "embedding's indices, the final norm's and the head's inputs, the loss's logits).")


def timeline_figures(records: list[dict], t: pd.DataFrame, run_dir: str | None = None) -> tuple[list[Figure], str]:
    """The section's figures and a note on what was left out or could not be read ("" when nothing was);
    timelines stored beside the records are read from `run_dir`'s ``timelines.jsonl``."""
    timelines = Timelines(run_dir)
    groups, left_out = choose(records, t, timelines=timelines)
    out = []
    for group in groups:
        names = " vs ".join(s.strategy for s in group.series)
        with plt.rc_context(STYLE):
            uri = _encode(draw(group))
        out.append(Figure(f"Memory timeline: {group.variant}, batch {group.batch}, seq {group.seq}", uri,
                          f"live bytes over the memory step for {names}, and saved bytes per layer",
                          caption(group)))
    notes = [f"{left_out} more model variant{'s' if left_out != 1 else ''} with a timeline not drawn "
             f"(at most {MAX_FIGURES} figures)."] if left_out else []
    if timelines.problems:
        notes.append(timelines.note())
    unmatched = timelines.unmatched({r.get("case_id") for r in records})
    if unmatched:
        notes.append(f"{unmatched} line{'s' if unmatched != 1 else ''} of {TIMELINES} belong{'s' if unmatched == 1 else ''} "
                     "to no point in the records (a point whose record was not written), ignored.")
    return out, " ".join(notes)
