"""Run one single-process Case in a worker forked from a preloaded fork server.

Isolation without the import bill: a fresh interpreter needs seconds to import torch and transformers,
so workers are forked from a ``multiprocessing`` fork server that imported them once (and never touched
CUDA).  A forked worker is a new process (clean peak memory, a crash or an OOM takes only that point) and
is ready with a built tiny model in about a twentieth of a second.  Whatever happens to the worker
becomes a result dict: its own result file, a timeout, a signal, or an exit without a result.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

from ..spec import Case
from ..store.files import tail
from .faults import Fault

STDERR_TAIL_CHARS = 2000


class IsolatedRunner:
    """Runs one single-process Case in a worker forked from a preloaded fork server."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("forkserver")
        # worker: torch, transformers and our probes; preload: what transformers imports lazily on the
        # first model build (about a third of a second per worker otherwise)
        self.ctx.set_forkserver_preload(["ckptbench.run.worker", "ckptbench.run.preload"])
        self.current = None

    def run(self, case: Case, work_dir: str, timeout_s: float, fault: Fault | None) -> dict:
        from .worker import child_main  # the fork server has it loaded; importing here keeps torch out

        result_path = os.path.join(work_dir, f"{case.id}.json")
        log_path = os.path.join(work_dir, f"{case.id}.log")
        for stale in (result_path, log_path):
            if os.path.exists(stale):
                os.remove(stale)
        t_submit = time.time()
        proc = self.ctx.Process(target=child_main, args=(case.to_dict(), result_path, log_path, t_submit, fault,
                                                         timeout_s), name=f"ckptbench-{case.id}")
        self.current = proc
        proc.start()
        proc.join(timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
            self.current = None
            return {"status": "timeout", "reason": f"no result after {timeout_s:g} s; worker killed",
                    "stderr_tail": tail(log_path, STDERR_TAIL_CHARS)}
        self.current = None
        wall = time.time() - t_submit
        if os.path.exists(result_path):
            with open(result_path) as fh:
                result = json.load(fh)
            os.remove(result_path)
        elif proc.exitcode is not None and proc.exitcode < 0:
            sig = signal.Signals(-proc.exitcode).name
            result = {"status": "crash", "reason": f"worker killed by signal {sig}"}
        else:
            result = {"status": "crash", "reason": f"worker exited with code {proc.exitcode} and no result"}
        if result["status"] != "ok":
            result["stderr_tail"] = tail(log_path, STDERR_TAIL_CHARS)
        result["wall_s"] = wall
        return result

    def kill_current(self) -> None:
        proc = self.current
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join()
