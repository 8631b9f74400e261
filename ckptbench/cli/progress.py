"""The sweep's progress display: one bar for the sweep, and a line per slot when points run side by side."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


class CountColumn(MofNCompleteColumn):
    """The overall bar's M/N; nothing on a slot's line."""

    def render(self, task) -> Text:
        return Text("") if task.fields.get("slot") else super().render(task)


def slot_lines(progress):
    """An ``on_running`` hook that keeps one progress line per slot: the point it runs, or idle."""
    tasks: dict[int, int] = {}
    shown: dict[int, str] = {}

    def on_running(points) -> None:
        if points and not tasks and points[0].placement.of > 1:
            for k in range(points[0].placement.of):
                tasks[k] = progress.add_task(f"  slot {k + 1}", total=1, start=False, last="idle", slot=True)
        if not tasks:
            return
        busy = {}
        for p in points:
            c = p.case
            label = (f"{p.case.strategy} b={c.batch_size} s={c.seq_len}"
                     f"{f' world={c.world_size}' if c.world_size > 1 else ''} on {p.placement.label()}")
            for k in p.placement.slots:
                busy[k] = label
        for k, task in tasks.items():
            label = busy.get(k, "idle")
            if shown.get(k) != label:
                shown[k] = label
                progress.reset(task, start=label != "idle", last=label, slot=True)  # the clock: this point's
    return on_running


def sweep_progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), CountColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[last]}"), transient=False)
