"""Each repeat of a step benchmark in a process of its own: ``python -m ckptbench.history.step_repeat
MODULE:FUNCTION OUT NAME`` builds the step with the function (``() -> (model, optimizer, batch, step)``)
and measures it into ``OUT`` as the ``ckptbench_step`` fixture does.

A process's memory layout, its core and what ran beside it move all its steps alike, so step times of one
process agree far better than those of two: measured in three processes, the record pools one median per
process (``repeat_medians_s``) and the history's test compares across processes, as a sweep's ``--repeat``
does (docs/history.md has what unchanged code measured each way gave).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile

REPEAT_TIMEOUT_S = 1800


def reference(build) -> str:
    """``module:qualname`` of a step's function, or ValueError when another process cannot import it."""
    module, name = getattr(build, "__module__", None), getattr(build, "__qualname__", "")
    if not module or module == "__main__" or "<" in name or not callable(build):
        raise ValueError(f"step_benchmark: {build!r} must be a function defined at the top of an importable "
                         "module (each repeat runs in a process of its own), or pass repeats=1")
    return f"{module}:{name}"


def measure_in_processes(name: str, build, out: str, repeats: int) -> tuple[list[dict], str]:
    """`repeats` records of the step, one per process, each with its ``repeat`` index (appended to `out`'s
    records by the caller), and what went wrong when fewer came back."""
    from ..store.records import load_records

    target = reference(build)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    records, problem = [], ""
    for k in range(repeats):
        work = tempfile.mkdtemp(prefix=f".repeat-{k}-", dir=out)
        try:
            done = subprocess.run([sys.executable, "-m", __name__, target, work, name], env=env,
                                  capture_output=True, text=True, timeout=REPEAT_TIMEOUT_S)
            found = load_records(work, merged=False).records
            if done.returncode != 0 or not found:
                tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}, no record"])[-1]
                problem = f"repeat {k}: {tail}"
                continue
            records.append({**found[-1], "repeat": k})
        except subprocess.TimeoutExpired:
            problem = f"repeat {k}: no record after {REPEAT_TIMEOUT_S} s"
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return records, problem


def main(argv: list[str]) -> int:
    target, out, name = argv
    module, _, qualname = target.partition(":")
    build = importlib.import_module(module)
    for part in qualname.split("."):
        build = getattr(build, part)
    from ..track import measure_step

    record = measure_step(*build(), out=out, name=name)
    return 0 if record is not None else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
