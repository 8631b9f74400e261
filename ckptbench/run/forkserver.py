"""Run one single-process Case in a worker forked from a preloaded fork server.

Isolation without the import bill: a fresh interpreter needs seconds to import torch and transformers,
so workers are forked from a ``multiprocessing`` fork server that imported them once (and never touched
CUDA).  A forked worker is a new process (clean peak memory, a crash or an OOM takes only that point) and
is ready with a built tiny model in about a twentieth of a second.  Whatever happens to the worker
becomes a result dict: its own result file, a timeout, a signal, or an exit without a result.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import threading
import time

from ..base.errors import WORKER_DISK_FULL_EXIT, storage_reason
from ..point.case import Case
from ..store.files import tail
from .faults import Fault
from .hostmem import WorkerWatch, explain_kill, human_bytes, read_host_memory
from .lifeline import SERVER_PARENT_VAR
from .slots import Placement

STDERR_TAIL_CHARS = 2000
SAMPLE_S = 0.1  # how often a running worker's memory is read (a few /proc files: microseconds)
# What the fork server imports before its first fork: its lifeline first (it must not outlive the sweep
# while importing torch), then torch, transformers and our probes, then what transformers imports lazily
# on the first model build (about a third of a second per worker otherwise)
PRELOAD = ["ckptbench.run.serverguard", "ckptbench.run.worker", "ckptbench.run.preload"]


def start_fork_server() -> None:
    """Start the workers' fork server now (if it is not running), armed to die with this process.

    From the main thread only: Linux sends the parent-death signal when the *thread* that started a
    child ends, and only the main thread lives as long as the sweep.  Started from another thread (by a
    point's first worker, with no call here) the server is not armed, and exits the slower way, when its
    pipe to the sweep closes.
    """
    ensure_server(armed=threading.current_thread() is threading.main_thread())


def ensure_server(armed: bool = False) -> None:
    """Start the fork server if it is not running; `armed`: to die with this process (main thread only)."""
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    if not armed:
        forkserver.ensure_running()
        return
    os.environ[SERVER_PARENT_VAR] = str(os.getpid())
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(SERVER_PARENT_VAR, None)


def _by_name(module: str, name: str, args: tuple):
    """``module.name(*args)``, in a process forked from the fork server (which has the module loaded)."""
    import importlib

    return getattr(importlib.import_module(module), name)(*args)


def _call_main(module: str, name: str, args: tuple, conn) -> None:
    """A process forked from the fork server: ``module.name(*args)``, its answer sent back through `conn` as
    JSON text (plain data: unpickling a value such as ``torch.__version__`` would import torch in the caller)."""
    try:
        conn.send_bytes(json.dumps(_by_name(module, name, args)).encode())
    except Exception as exc:  # noqa: BLE001 - whatever went wrong is the answer
        conn.send_bytes(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
    finally:
        conn.close()


def forked_call(module: str, name: str, args: tuple, timeout_s: float, label: str) -> dict:
    """``module.name(*args)`` (a dict) in a process forked from the fork server, where torch is imported
    already: a fifth of a second where a child interpreter pays seconds of imports.  Named by strings, so
    the caller's process imports nothing of it.  {"error": why} when no answer came back."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_call_main, args=(module, name, args, send), name=label)
    try:
        ensure_server()
        proc.start()
    except (OSError, EOFError, ValueError) as exc:  # the fork server is gone: no answer, said so
        receive.close()
        send.close()
        return {"error": f"could not start a process from the fork server: {type(exc).__name__}: {exc}"}
    send.close()
    try:
        if not receive.poll(timeout_s):
            return {"error": f"no answer after {timeout_s:g} s"}
        return json.loads(receive.recv_bytes())
    except EOFError:
        return {"error": f"the process ended without an answer (exit code {proc.exitcode})"}
    finally:
        receive.close()
        proc.kill()
        proc.join()


class IsolatedRunner:
    """Runs one single-process Case in a worker forked from a preloaded fork server."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.current = None
        self.cancelled = False  # kill_current was called: a worker started after that is killed at once

    def run(self, case: Case, work_dir: str, timeout_s: float, fault: Fault | None,
            memory_cap: int | None = None, placement: Placement | None = None, repeat: int = 0) -> dict:
        """Run `case` in a fresh worker, watching its memory; stop it past `timeout_s` or `memory_cap`.

        The worker pins itself to `placement`'s cores and sees only its devices; repeats of one Case get
        files of their own, since on several slots they may run at the same time.
        """
        name = case.id if repeat == 0 else f"{case.id}-{repeat}"
        result_path = os.path.join(work_dir, f"{name}.json")
        log_path = os.path.join(work_dir, f"{name}.log")
        where = {"cores": list(placement.cores), "env": placement.env()} if placement is not None else None
        for stale in (result_path, log_path):
            if os.path.exists(stale):
                os.remove(stale)
        t_submit = time.time()
        # the worker's entry named, not imported: importing it here would load torch and transformers into
        # the sweep's parent (seconds, and hundreds of MB) only to pickle a reference the fork server resolves
        proc = self.ctx.Process(target=_by_name, args=("ckptbench.run.worker", "child_main", (
            case.to_dict(), result_path, log_path, t_submit, fault, timeout_s, where, memory_cap)),
            name=f"ckptbench-{case.id}")
        self.current = proc
        ensure_server()
        proc.start()
        if self.cancelled:  # stopped from another thread while this one was starting the worker
            proc.kill()
        watch = WorkerWatch(proc.pid, memory_cap)
        stopped = self._wait(proc, watch, timeout_s)
        self.current = None
        wall = time.time() - t_submit
        if stopped is not None:
            result = stopped
        elif os.path.exists(result_path):
            with open(result_path) as fh:
                result = json.load(fh)
            os.remove(result_path)
        elif proc.exitcode is not None and proc.exitcode < 0:
            result = _killed(signal.Signals(-proc.exitcode).name, watch)
        elif proc.exitcode == WORKER_DISK_FULL_EXIT:
            result = {"status": "crash", "reason": f"{storage_reason(errno.ENOSPC)} writing {result_path}"}
        else:
            result = {"status": "crash", "reason": f"worker exited with code {proc.exitcode} and no result"}
        if result["status"] != "ok":
            result["stderr_tail"] = tail(log_path, STDERR_TAIL_CHARS)
        result["wall_s"] = wall
        return result

    @staticmethod
    def _wait(proc, watch: WorkerWatch, timeout_s: float) -> dict | None:
        """Wait for the worker, sampling its memory; a result only when the sweep had to stop it."""
        deadline = time.monotonic() + timeout_s
        while True:
            proc.join(SAMPLE_S)  # returns as soon as the worker ends
            if not proc.is_alive():
                return None
            watch.sample()
            if watch.over_cap():
                proc.kill()
                proc.join()
                return {"status": "oom", "host_memory": watch.figures(),
                        "reason": f"stopped by the sweep: the worker held {human_bytes(watch.peak_rss)}, more than "
                                  f"the --memory cap of {human_bytes(watch.cap)}"}
            if time.monotonic() >= deadline:
                proc.kill()
                proc.join()
                return {"status": "timeout", "reason": f"no result after {timeout_s:g} s; worker killed"}

    def kill_current(self) -> None:
        """Kill the worker in flight, from any thread; the thread waiting on it sees it end and returns.

        No ``join`` or ``is_alive`` here: both read the fork server's exit-status pipe, which the waiting
        thread reads too, and two readers of it race.
        """
        self.cancelled = True
        proc = self.current
        if proc is not None:
            try:
                proc.kill()
            except (AttributeError, OSError, ValueError):  # not started yet (the check after start kills it)
                pass


def _killed(sig: str, watch: WorkerWatch) -> dict:
    """A worker that died of a signal without a result: ``oom`` when its memory says so, else ``crash``."""
    why = explain_kill(watch, read_host_memory()) if sig == "SIGKILL" else None
    if why:
        return {"status": "oom", "reason": why, "host_memory": watch.figures()}
    return {"status": "crash", "reason": f"worker killed by signal {sig}", "host_memory": watch.figures()}
