"""One sweep point, measured in the process that runs it.

The step loop is the familiar one: warm-up steps (clean, they also create the optimizer state), memory
steps (the probes that slow operators run only here), then timed steps (clean again).  The record says
which steps were which.  :func:`child_main` is the entry point of a worker process forked from the fork
server (see :mod:`.forkserver`): it redirects the process's output to the point's log file and writes exactly
one result file, atomically, whatever happens short of the process being killed.
"""

from __future__ import annotations

import errno
import json
import os
import time
import traceback

import torch

from ..base.errors import DISK_FULL, WORKER_DISK_FULL_EXIT, failure_reason
from ..measure.interval import median_interval, record_fields
from ..measure.layertime import LayerClock
from ..measure.steps import StepLosses, step_probe_for
from ..measure.stopping import StopRule
from ..measure.timing import StepStats, timer_for
from ..point.case import Case
from ..store.files import write_json_atomic
from ..theory.time.flops import figures as flop_figures
from ..train.adapters import adapter_facts, base_parameter_count, with_adapters
from ..train.checkpointing import decoder_layers, offload_for
from ..train.environment import torch_environment
from ..train.loops import loop_for, memory_step
from ..train.models import build_model, dropout_values, synthetic_batch
from ..train.optimizers import describe_optimizer
from ..train.precision import Amp
from ..train.reference import reference
from ..train.support import refusal as setup_refusal
from .compiled_step import CompiledStepMarks, measured_only_flops
from .faults import Fault
from .hostmem import human_bytes, limit_private_memory, resident_bytes
from .lifeline import die_with_parent, let_the_fork_server_go, self_timeout
from .memory_step import MemoryStepMarks


def _memory_step(case: Case, model, optimizer, batch, layers: list) -> dict:
    """One memory step of the manual loop on a model and optimizer its caller built: the probes' result."""
    marks = MemoryStepMarks(layers)
    memory_step(model, optimizer, batch, case.grad_accum, Amp.of(case), marks)
    return marks.result()


class StepSchedule:
    """Which optimizer step is which (warm-up, memory, timed) and what runs around each: the clean steps'
    probe (CUDA allocator peaks, window energy), the timer of the timed steps, an injected slowdown, and
    when the timed steps stop (:class:`~ckptbench.measure.stopping.StopRule`: the median's 95 % interval
    within ±precision, or a cap).

    Every loop (:mod:`ckptbench.train.loops`) runs the steps this yields (``for k in schedule``) and
    reports each here, so the steps mean the same whatever loop ran them.  ``total`` is the most there
    can be (a loop that must say so in advance, Trainer's ``max_steps``, stops early on :attr:`done`).
    `start` is the optimizer step the schedule's first step is (a tracked run measured again later on)."""

    def __init__(self, case: Case, device: torch.device, layers: list, fault: Fault | None,
                 time_left_s: float | None = None, model=None, start: int = 0):
        t = case.train
        self.start = start
        self.rule = StopRule.of(t, device.type, time_left_s)
        self.warmup, self.memory = t.warmup_steps, t.memory_steps
        self.total = self.warmup + self.memory + self.rule.max_steps
        self.fault = fault
        # a compiled point: probes that leave the compiled graphs running (run/compiled_step.py)
        self.marks = CompiledStepMarks() if case.compiled else MemoryStepMarks(layers)
        self.steps = step_probe_for(device)  # CUDA: per-step allocator peaks, window energy; CPU: nothing
        self.timer = timer_for(device.type)
        self.losses = StepLosses(self.total)
        self.mem: dict = {}
        self._window: str | None = None
        self.stats: StepStats | None = None
        self.stopped_by: str | None = None  # "precision" | "max_steps" | "max_time", once timing stops
        self.timed_s = 0.0  # host seconds from the first timed step to the last read of the times
        self._t_timed: float | None = None
        # each decoder layer's forward, timed in place during the timed steps (the step-time model's baseline);
        # a compiled point's layers run inside inductor's graphs, where hooks would break them
        self.clock = None if case.compiled or not layers else LayerClock(layers, device, model)
        self.layer_times: dict = {}  # the clock's result, once finished
        # host seconds each kind of step took, start to end (a CUDA step's queue drained at its end): the
        # point's steps, against which the harness's cost (the record's `harness_ratio`) is stated
        self.steps_s = {"warmup": 0.0, "memory": 0.0, "timed": 0.0}
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None

    def __iter__(self):
        k = 0
        while not self.done:
            yield k
            k += 1

    @property
    def done(self) -> bool:
        return self.stopped_by is not None

    def kind(self, k: int) -> str:
        k -= self.start
        return "warmup" if k < self.warmup else "memory" if k < self.warmup + self.memory else "timed"

    def begin(self, k: int) -> None:
        kind = self.kind(k)
        self._t_begin = time.perf_counter()
        if kind != self._window:
            self._close()
            self._window = kind
            if kind != "memory":
                self.steps.begin(kind)
        if kind != "memory":
            self.steps.before_step()
        if kind == "timed":
            if self.clock is not None:
                self.clock.start()
            self.timer.start()
            self._t_step = time.perf_counter()
            if self._t_timed is None:
                self._t_timed = self._t_step

    def end(self, k: int, loss) -> None:
        kind = self.kind(k)
        if self._sync is not None and kind != "timed":  # the timed steps' timer reads its events instead
            self._sync()
        self.steps_s[kind] += time.perf_counter() - self._t_begin
        if kind == "timed":
            fault = self.fault
            if fault is not None and fault.kind == "slow":
                time.sleep(fault.seconds)
            if fault is not None and fault.kind == "slower":  # this step, `fraction` longer (CPU: no sync needed)
                time.sleep(fault.fraction * (time.perf_counter() - self._t_step))
            self.timer.stop()
            if self.clock is not None:
                self.clock.stop()
        if kind == "memory":
            self.mem = self.marks.result()
        else:
            self.steps.after_step()
            self.losses.append(loss)
        if kind == "timed":
            n = k - self.start - self.warmup - self.memory + 1
            if self.rule.due(n):  # on CUDA a synchronise, every few steps (StopRule.check_every)
                times = self.timer.times()
                self.timed_s = time.perf_counter() - self._t_timed
                self.stopped_by = self.rule.verdict(times, self.timed_s)

    def _close(self) -> None:
        if self._window == "timed":
            self.stats = StepStats.of(self.timer.times())  # the window's last synchronise (CUDA)
        if self._window in ("warmup", "timed"):
            self.steps.end()

    def finish(self) -> StepStats:
        self._close()
        self._window = None
        if self.clock is not None:  # the timed steps' layer forwards, read once their events are done
            self.layer_times = self.clock.result()
            self.clock.close()
        return self.stats

    def timing(self) -> dict:
        """The record's account of the timed steps: how many, why they stopped, what was asked, and the
        median's interval with its method and the coverage it really has."""
        times = list(self.stats.times_s) if self.stats else []
        interval = median_interval(times)
        return {"timed_steps": len(times), "timing_stopped_by": self.stopped_by,
                "timing_target": self.rule.to_dict(), "timing_window_s": self.timed_s,
                **record_fields(interval)}


class Unsupported(Exception):
    """The point cannot run on this machine at all (not a failure of the setting): recorded as such."""


def measure(case: Case, t_submit: float | None = None, fault: Fault | None = None,
            timeout_s: float | None = None) -> dict:
    """Build the model for `case`, train warm-up + memory + timed steps, return the measurement.  With the
    worker's `timeout_s`, the timed steps stop in time (:meth:`StopRule.of`)."""
    t_enter = time.time()
    torch.set_num_threads(case.train.threads)
    torch.manual_seed(case.train.seed)
    device = torch.device(case.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Unsupported(f"device 'cuda' requested, but this torch ({torch.__version__}) sees no CUDA device")
    if fault is not None and fault.kind not in ("slow", "slower"):
        inject(fault)

    with offload_for(case) as offload_facts:  # offload_kind, offload_pinned, offload_moved, offload_note
        try:
            model = build_model(case.model, device)
        except (AssertionError, NotImplementedError, ValueError) as exc:  # a config this model type refuses
            raise Unsupported(f"transformers could not build a causal LM of model_type {case.model.family!r}: "
                              f"{type(exc).__name__}: {exc}"[:500]) from None
        layers = decoder_layers(model)
        if case.checkpointed_layers and not layers:
            raise Unsupported(f"{type(model).__name__} has no GradientCheckpointingLayer blocks: transformers "
                              "cannot checkpoint it layer by layer")
        refusal = setup_refusal(case)
        if refusal:
            raise Unsupported(refusal)
        try:
            model = with_adapters(model, case.setup.lora)  # checkpointing is switched on after, by the loop
        except ValueError as exc:  # peft's: a target module the model does not have
            raise Unsupported(f"peft could not add LoRA adapters to {type(model).__name__}: {exc}"[:500]) from None
        batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, case.train.seed, device)
        try:
            loop = loop_for(case, model, batch)
        except ValueError as exc:  # "... does not support gradient checkpointing"
            raise Unsupported(f"{type(model).__name__}: {exc}") from None
        checkpointing_api = loop.checkpointing_api
        t_ready = time.time()

        time_left = timeout_s - (time.time() - t_enter) if timeout_s else None
        schedule = StepSchedule(case, device, layers, fault, time_left, model)
        loop.run(schedule)
        schedule.finish()
        timing = {"spawn_s": (t_enter - t_submit) if t_submit else None,
                  "setup_s": (t_ready - t_submit) if t_submit else None, "model_build_s": t_ready - t_enter}
    return measurement_of(case, schedule, model, loop, checkpointing_api, offload_facts, timing)


def measurement_of(case: Case, schedule: StepSchedule, model, loop, checkpointing_api: str | None,
                   offload_facts: dict, timing: dict, padded: int | None = None) -> dict:
    """The record's measurement of a point whose steps `schedule` has seen (finished): its memory step's
    probes, its timed steps, and what the model, optimizer and loop that ran them were.  The worker's, and
    that of a user's own run (:mod:`ckptbench.track`), which hands over its own model and loop (and
    `padded`, its memory step's attention mask, :func:`simulated_estimate`)."""
    device = torch.device(case.device)
    stats, mem, steps, timer = schedule.stats, schedule.mem, schedule.steps, schedule.timer
    losses = schedule.losses.values()
    return {
        **mem,
        **steps.result(),
        **(measured_only_flops(case, flop_figures(case, stats.median_s, _device_name(device))) if case.model.analytic else
           {"flops_convention": f"no FLOP formula for model_type {case.model.family!r}: counted FLOPs only"}),
        **({} if case.analytic or case.compiled else simulated_estimate(case, padded)),
        **(loop.facts() if hasattr(loop, "facts") else {}),
        "precision": case.precision,
        "loop": case.setup.loop,
        "optimizer": describe_optimizer(loop.optimizer),  # the class and settings that ran
        "checkpointing_api": checkpointing_api,
        "attn_implementation": model.config._attn_implementation,  # what transformers built, not what was asked
        "dropout": dropout_values(model.config),  # the probabilities the model ran with, from its own config
        "step_times_s": list(stats.times_s),
        "step_time_median_s": stats.median_s,
        "step_time_p90_s": stats.p90_s,
        "step_time_mean_s": stats.mean_s,
        "step_time_cv": stats.cv,
        # the CPU time of the stepping thread (CPU points): with one torch thread, the step's own cost
        "step_cpu_times_s": timer.cpu_times(),
        "tokens_per_s": case.tokens_per_step / stats.median_s if stats.median_s > 0 else None,
        "timer": timer.kind,
        "losses": losses,
        "layer_times": schedule.layer_times,  # each decoder layer's forward in the timed steps: the step-time baseline
        **schedule.timing(),
        "steps": {"warmup": case.train.warmup_steps, "memory": case.train.memory_steps,
                  "timed": len(stats.times_s), "memory_steps_timed": False},
        "steps_wall_s": schedule.steps_s,  # host seconds of the warm-up, memory and timed steps (the loop's)
        **timing,  # spawn_s, setup_s, model_build_s
        **offload_facts,
        "n_params": base_parameter_count(model),  # the model's own, as its config gives them: adapters apart
        **adapter_facts(model),  # trainable_params; with adapters, peft's resolved targets
        # every key the model was built with, defaults included, through transformers' own serialiser
        "resolved_config": json.loads(model.config.to_json_string(use_diff=False)),
        # the config the Case asks for and its parameter count, built apart from the builder (meta device)
        **reference(case.model),
        "threads": torch.get_num_threads(),
    }


def simulated_estimate(case: Case, padded: int | None = None) -> dict:
    """For a model the analytic estimate does not describe: the FakeTensor simulation of the same step,
    run here after the measured steps (it needs torch, the sweep's parent has none).  Its figures are the
    estimate the record is checked against; a model it cannot simulate says why instead.  `padded`: the
    step's batch has an attention mask padding that many tokens (a tracked run's)."""
    from ..theory.memory.simulate import simulate
    from ..theory.memory.simulated import simulate_case

    line = simulate_case(case, simulate, padded)  # data-dependent routing, an op FakeTensor cannot run: a reason
    if line["status"] != "ok":
        return {"simulation": None, "simulation_error": line["reason"]}
    return {"simulation": line["simulated"]}


def _device_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def device_environment(device_type: str) -> dict:
    """The torch half of the record's ``env`` (the sweep adds the host half): what ``ckptbench env`` shows,
    seen by the process that ran the point.  A CPU point leaves CUDA uninitialised."""
    return torch_environment(touch_cuda=device_type == "cuda")


def inject(fault: Fault) -> None:
    if fault.kind == "raise":
        raise RuntimeError("injected fault: worker raised")
    if fault.kind == "segfault":
        import ctypes

        ctypes.string_at(0)
    if fault.kind == "hang":
        while True:
            time.sleep(3600)
    if fault.kind == "exit":
        os._exit(3)
    if fault.kind == "disk-full":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(os.getcwd(), "checkpoint.bin"))
    if fault.kind in ("hog", "hog-kill"):
        _hog(fault.nbytes, fault.kind == "hog-kill")
    if fault.kind == "alloc":  # through torch's CPU allocator, as a point's own tensors are
        torch.ones(fault.nbytes, dtype=torch.uint8)


def _hog(nbytes: int, then_kill: bool) -> None:
    """Hold `nbytes` resident (the fork server's pages included), long enough for the sweep to see it.

    Shared memory (as a DataLoader's or a tensor's ``share_memory_()``), which counts in the resident
    size the sweep watches but not in the private-memory limit a worker sets (:func:`.hostmem.limit_private_memory`).
    """
    import mmap
    import signal

    from .hostmem import resident_bytes

    rss = resident_bytes(os.getpid())
    held = mmap.mmap(-1, max(mmap.PAGESIZE, nbytes - (rss[0] if rss else 0)))  # anonymous, MAP_SHARED
    for offset in range(0, len(held), mmap.PAGESIZE):  # written, so every page is resident
        held[offset] = 1
    deadline = time.monotonic() + (2.0 if then_kill else 3600.0)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    if then_kill:
        os.kill(os.getpid(), signal.SIGKILL)
    held.close()


def is_oom_error(exc: BaseException) -> bool:
    """Out-of-memory raised outside the caching allocator (cuBLAS/cuDNN workspaces, a kernel's own
    cudaMalloc) arrives as a plain RuntimeError or AcceleratorError, and the CPU allocator's as
    ``DefaultCPUAllocator: can't allocate memory``; their messages say so."""
    if isinstance(exc, MemoryError):  # Python's own allocations past the worker's limit
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        sign in text for sign in ("out of memory", "cublas_status_alloc_failed", "can't allocate memory"))


def child_main(case_dict: dict, result_path: str, log_path: str, t_submit: float,
               fault: Fault | None = None, timeout_s: float | None = None, where: dict | None = None,
               memory_cap: int | None = None) -> None:
    """Entry point of a worker process: one Case, one result file, output to the point's log.

    It dies with the fork server (which dies with the sweep) and, failing all else, after its own timeout.
    `where` is its slot: the cores it pins itself to before torch starts a thread, and the variables
    (``CUDA_VISIBLE_DEVICES``) set before CUDA is first touched; the cores it then has are reported.
    A CPU point under `memory_cap` (``--memory-gib``) limits its private memory to it: an allocation past
    it fails, recorded ``oom`` (a CUDA point's driver maps memory the limit would wrongly count).
    """
    die_with_parent()
    let_the_fork_server_go()
    self_timeout(timeout_s)
    if where:
        os.environ.update(where["env"])
        if where["cores"]:
            os.sched_setaffinity(0, where["cores"])
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    case = Case.from_dict(case_dict)
    limited = memory_cap is not None and case.device == "cpu" and limit_private_memory(memory_cap)
    # resident before the point builds anything: what the fork server imported, which a --memory cap counts
    resident = resident_bytes(os.getpid())
    result: dict = {"status": "ok", "reason": ""}
    try:
        result["measurement"] = measure(case, t_submit, fault, timeout_s)
    except Unsupported as exc:
        result = {"status": "unsupported", "reason": str(exc)}
    except torch.OutOfMemoryError as exc:  # torch.cuda.OutOfMemoryError is this class
        traceback.print_exc()
        result = {"status": "oom", "reason": str(exc).splitlines()[0][:500]}
    except Exception as exc:
        traceback.print_exc()
        status = "oom" if is_oom_error(exc) else "crash"
        result = {"status": status, "reason": failure_reason(exc)[:500]}
        if status == "oom" and limited:
            result["reason"] += f" (private memory limited to the --memory-gib cap of {human_bytes(memory_cap)})"
    result["device_env"] = device_environment(case.device)
    result["cores_seen"] = sorted(os.sched_getaffinity(0))
    result["baseline_rss_bytes"] = resident[0] if resident else None
    try:
        write_json_atomic(result_path, result)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        os._exit(WORKER_DISK_FULL_EXIT)  # no file to say it in: the exit status says it
