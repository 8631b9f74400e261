"""The sweep's progress: with points side by side, a line per slot says what it runs."""

from __future__ import annotations

import io

from rich.console import Console

from ckptbench.cli.progress import slot_lines, sweep_progress
from ckptbench.point.case import Case, preset
from ckptbench.point.training import TrainSpec
from ckptbench.run.scheduler import Running
from ckptbench.run.slots import cpu_slots, place


def render(progress) -> str:
    out = io.StringIO()
    Console(file=out, width=120, force_terminal=False).print(progress.make_tasks_table(progress.tasks))
    return out.getvalue()


def test_each_slot_has_a_line_with_its_point_or_idle():
    slots = cpu_slots(2, 1, [0, 1])
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=4, seq_len=32, every_n_layers=1)
    progress = sweep_progress()
    progress.add_task("smoke", total=5, last="")
    on_running = slot_lines(progress)
    on_running([Running(case, 0, place(case, slots, {1}))])
    lines = render(progress).splitlines()
    assert "smoke" in lines[0] and "0/5" in lines[0]
    assert "slot 1" in lines[1] and "idle" in lines[1]
    assert "slot 2" in lines[2] and "full b=4 s=32 on cores 1" in lines[2] and "0/1" not in lines[2]
    on_running([])
    assert "idle" in render(progress).splitlines()[2]


def test_one_slot_adds_no_lines():
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    progress = sweep_progress()
    progress.add_task("smoke", total=1, last="")
    slot_lines(progress)([Running(case, 0, place(case, cpu_slots(1, 1, [0]), {0}))])
    assert len(progress.tasks) == 1
