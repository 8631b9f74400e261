"""The step-time model at run time: trace a Case, time here what this machine has not timed yet, price the step.

:func:`predict` takes the ops the Case's step runs (the worker's memory step recorded them; without
them, the step is traced on fake tensors: :func:`ckptbench.theory.optrace.trace_case`), looks each distinct
entry up in the machine's rate cache (:mod:`.ratecache`), times the ones it lacks
(:mod:`ckptbench.measure.oprates`), and prices the step (:func:`ckptbench.theory.steptime.step_cost`).
No training step of the Case is timed to calibrate anything: every rate is an operator microbenchmark.

The one figure that is not an operator's is the framework's time per op: what a step spends beside its
kernels (Python, the modules' code, autograd's graph and engine, checkpoint's bookkeeping, the optimizer's
loop).  It is measured on the same architecture (family, layer count, heads, checkpointing, offload,
precision, loop, optimizer) shrunk until its kernels cost nothing: 4 wide a head, a 64-token vocabulary, one
sequence of 16 tokens (:func:`probe_case`).  Its step time less its own ops' timed cost, per op, is the
framework's time per op on a CPU; on a GPU, where the host runs ahead of the kernels, the probe's whole
step per op is the host's time, and the step takes the longer of the two.  Each architecture is probed once
per rate cache (a sweep's, or the one ``plan`` keeps) and kept there.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from dataclasses import replace

from ..spec import Case
from ..theory.plantime import depth_extrapolated
from ..theory.steptime import Rates, step_cost
from .ratecache import DEFAULT_DIR, RateCache, machine_facts

PROBE_HEAD_WIDTH = 4
PROBE_VOCAB = 64
PROBE_TOKENS = 16
# a round is one step and one timing of its ops: this machine's speed flips by 2x within a second, and
# rounds of three steps then their ops put them in different phases (per-op figures 3.1-8.2 us over six
# probes of one architecture; one step a round: 5.0-6.6 us)
PROBE_WARMUP, PROBE_ROUNDS, PROBE_ROUND_STEPS = 3, 15, 1


def architecture_key(case: Case) -> str:
    """Everything that decides which ops a step runs, except the widths, the batch and the sequence."""
    spec = case.model
    return json.dumps({"family": spec.family, "layers": spec.layers, "heads": spec.heads, "kv_heads": spec.kv_heads,
                       "dtype": spec.dtype, "attn": spec.attn, "tie": spec.tie_embeddings, "config": spec.config,
                       "dropout": spec.dropout, "every_n_layers": case.every_n_layers, "offload": case.offload,
                       "grad_accum": case.grad_accum, "device": case.device, "setup": case.setup.id_fields()},
                      sort_keys=True)


def probe_case(case: Case) -> Case:
    """The Case's architecture with nothing to compute: heads 4 wide, a 64-token vocabulary, 1 × 16 tokens."""
    spec = case.model
    extra = spec.config_extra
    if "head_dim" in extra:
        extra["head_dim"] = PROBE_HEAD_WIDTH
    hidden = spec.heads * PROBE_HEAD_WIDTH
    small = replace(spec, hidden=hidden, intermediate=2 * hidden, vocab=PROBE_VOCAB, name="",
                    config=json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra else "")
    return replace(case, model=small, batch_size=1, seq_len=PROBE_TOKENS)


class _ProbeSchedule:
    """What a loop reports its steps to (as :class:`.schedule.StepSchedule`): warm-up steps, one step under
    the op recorder, then :data:`PROBE_ROUNDS` rounds of timed steps (the stepping thread's CPU time on a
    one-thread CPU, else the wall clock), each round followed by a timing of every op the recorded step ran.
    Steps and microbenchmarks alternate, so each round's framework time is taken under one set of conditions
    (a shared machine's moved the probe's steps by half between minutes, and its speed flips by 2× within a
    second).  No memory step."""

    def __init__(self, layers: list, device, price):
        import torch

        from ..measure.optrace import OpRecorder
        from ..measure.timing import timer_for
        from .memory_step import MemoryStepMarks

        self.total = PROBE_WARMUP + 1 + PROBE_ROUNDS * PROBE_ROUND_STEPS
        self.marks = MemoryStepMarks(layers)  # never started: no step is a memory step
        self.timer = timer_for(device.type)
        self.cpu = device.type == "cpu" and torch.get_num_threads() == 1
        self.recorder = OpRecorder()
        self.gpu = device.type == "cuda"
        self.price = price  # entries -> (their kernels' seconds, their dispatched ops)
        self.rounds: list[float] = []  # framework seconds per op, one per round
        self.steps: list[float] = []  # each round's median step
        self.kernels: list[float] = []  # each round's ops, timed

    def __iter__(self):
        return iter(range(self.total))

    @property
    def done(self) -> bool:
        return False  # every step the probe plans runs: a fixed number, whatever their times

    def kind(self, k: int) -> str:
        return "warmup" if k < PROBE_WARMUP else "recorded" if k == PROBE_WARMUP else "timed"

    def begin(self, k: int) -> None:
        if self.kind(k) == "timed":
            self.timer.start()
        elif self.kind(k) == "recorded":
            self.recorder.__enter__()

    def end(self, k: int, loss) -> None:
        if self.kind(k) == "recorded":
            self.recorder.__exit__(None, None, None)
        elif self.kind(k) == "timed":
            self.timer.stop()
            if (k - PROBE_WARMUP) % PROBE_ROUND_STEPS == 0:  # a round's last step
                steps = (self.timer.cpu_times() if self.cpu else self.timer.times())[-PROBE_ROUND_STEPS:]
                kernels, ops = self.price(self.recorder.trace())
                step = statistics.median(steps)
                # a GPU's host runs ahead of its kernels: the probe's whole step is the host's time
                self.rounds.append((step if self.gpu else step - kernels) / ops)
                self.steps.append(step)
                self.kernels.append(kernels)


def _probe(case: Case, price, schedule_for=_ProbeSchedule) -> _ProbeSchedule:
    """The probe's steps through the point's own loop (:class:`_ProbeSchedule`, or what `schedule_for`
    makes of the model's layers, the device and `price`)."""
    import torch

    from ..train.adapters import with_adapters
    from ..train.checkpointing import decoder_layers, offload_for
    from ..train.loops import loop_for
    from ..train.models import build_model, synthetic_batch

    torch.manual_seed(case.train.seed)
    device = torch.device(case.device)
    with offload_for(case):
        model = with_adapters(build_model(case.model, device), case.setup.lora)
        batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, case.train.seed, device)
        loop = loop_for(case, model, batch)
        schedule = schedule_for(decoder_layers(model), device, price)
        loop.run(schedule)
    return schedule


def _timed(entries: list[dict], cache: RateCache, device: str,
           fresh: dict[str, float] | None = None) -> tuple[dict[str, float], int]:
    """key -> seconds for every entry that can be timed: from `fresh` (timed between the point's steps),
    else the cache, else timed here."""
    from ..measure.oprates import time_entry

    fresh = fresh or {}
    found, new = {}, dict(fresh)
    for e in entries:
        if e["kind"] == "view":
            continue
        seconds = fresh.get(e["key"], cache.entry(e["key"]))
        if seconds is None and e["key"] not in new:
            seconds = new[e["key"]] = time_entry(e, device)
        if seconds is not None:
            found[e["key"]] = seconds
    cache.add(new)
    return found, sum(v is not None for v in new.values())


def _figures(cache: RateCache, device: str) -> dict:
    """The dispatcher's per-call time, the copy bandwidth and the in-place rate (a memory-bound op's floor)."""
    from ..measure import oprates

    wanted = {"dispatch_s": lambda: oprates.dispatch_overhead(device),
              "bandwidth_bytes_per_s": lambda: oprates.memory_bandwidth(device),
              "inplace_bytes_per_s": lambda: oprates.inplace_bandwidth(device)}
    if device == "cuda":
        wanted["matmul_flops_per_s"] = lambda: oprates.matmul_rate(device)
        wanted["link_bytes_per_s"] = lambda: oprates.link_bandwidth()
    new = {name: measure() for name, measure in wanted.items() if cache.figure(name) is None}
    cache.add({}, figures=new)
    return {name: cache.figure(name) for name in wanted}


def _kernels(entries: list[dict], timed: dict[str, float], figures: dict, device: str) -> tuple[float, int]:
    """The kernels' seconds of a probe's step (its ops at the times one round gave them) and its ops."""
    cost = step_cost(entries, Rates(device, "", timed, dispatch_s=figures["dispatch_s"],
                                    bandwidth_bytes_per_s=figures["bandwidth_bytes_per_s"],
                                    inplace_bytes_per_s=figures.get("inplace_bytes_per_s")))
    return cost.kernel_s, cost.ops


def framework_from_rounds(probe: dict, figures: dict, device: str) -> dict:
    """The framework's time per op from the probe's steps taken between the point's own
    (:mod:`.probethread`): each round's step less its ops as that round timed them, per op; the median.
    Where the round's second step read the point's traffic before each module (`polluted_s`, its reads'
    time out: :mod:`ckptbench.measure.cachescrub`), that step's figure is the one the point is priced at;
    the plain step's stays beside it (`clean_per_op_s`)."""
    clean, polluted, kernels = [], [], []
    pairs = probe.get("polluted_s") or []
    for i, (step, timed) in enumerate(zip(probe["steps_s"], probe["timed"], strict=True)):
        kernel_s, ops = _kernels(probe["trace"], timed, figures, device)
        clean.append((step - kernel_s) / ops)
        if i < len(pairs):
            polluted.append((pairs[i] - kernel_s) / ops)
        kernels.append(kernel_s)
    per_op = polluted or clean
    scrub = probe.get("scrub_bytes") or 0
    how = (f"; each module's forward in its second step after a read of {scrub / 2**20:.2f} MiB, the point's "
           f"forward traffic over {probe.get('scrub_calls')} module calls" if polluted else "")
    return {"per_op_s": statistics.median(per_op), "rounds_per_op_s": per_op,
            "clean_per_op_s": statistics.median(clean), "scrub_bytes": scrub if polluted else 0,
            "step_s": statistics.median(probe["steps_s"]), "kernel_s": statistics.median(kernels),
            "probe": f"{probe['label']}, one step in each of the point's {len(clean)} rate rounds{how}"}


def framework_time(case: Case, cache: RateCache) -> dict:
    """The architecture's framework time per op (see the module's text), from the cache or probed now: the
    median of the probe's rounds, each its steps' median less its ops' timed cost (one trial each), per op."""
    from ..measure.oprates import measure_entries

    arch = architecture_key(case)
    found = cache.framework(arch)
    if found:
        return found
    figures = _figures(cache, case.device)

    def price(entries: list[dict]) -> tuple[float, int]:
        return _kernels(entries, measure_entries(entries, case.device, trials=1), figures, case.device)

    probe = probe_case(case)
    schedule = _probe(probe, price)
    found = {"per_op_s": statistics.median(schedule.rounds), "rounds_per_op_s": schedule.rounds,
             "step_s": statistics.median(schedule.steps), "kernel_s": statistics.median(schedule.kernels),
             "probe": f"{probe.model.label}, {probe.strategy}, b=1 s={PROBE_TOKENS}"}
    cache.add({}, framework={arch: found})
    return found


def measured_rates(case: Case, entries: list[dict], cache: RateCache, fresh: dict[str, float] | None = None,
                   probe: dict | None = None, between: dict | None = None) -> tuple[Rates, dict]:
    """The Rates that price `entries` on this machine (`fresh`: entries timed between the point's steps,
    which the cache is then given; `probe`: the framework probe's steps taken between them; `between`: the
    figures measured between them (the copy bandwidth, the in-place rate), over the cache's), and how many of them were timed
    now."""
    t0 = time.perf_counter()
    figures = {**_figures(cache, case.device), **{k: v for k, v in (between or {}).items() if v}}
    framework = framework_from_rounds(probe, figures, case.device) if probe else framework_time(case, cache)
    timed, now = _timed(entries, cache, case.device, fresh)
    machine = cache.machine
    stamps = cache.measured_at(list(timed), architecture_key(case))
    when = stamps[0] if len(stamps) == 1 else f"{stamps[0]} to {stamps[-1]}" if stamps else "now"
    threads = machine["threads"]
    source = (f"measured here ({machine['device_name']}, {threads} thread{'s' * (threads > 1)}, torch "
              f"{machine['torch']}) at {when}")
    rates = Rates(case.device, source, timed, dispatch_s=figures["dispatch_s"],
                  framework_s_per_op=framework["per_op_s"], host_bound=case.device == "cuda",
                  matmul_flops_per_s=figures.get("matmul_flops_per_s"),
                  bandwidth_bytes_per_s=figures["bandwidth_bytes_per_s"],
                  inplace_bytes_per_s=figures.get("inplace_bytes_per_s"),
                  link_bytes_per_s=figures.get("link_bytes_per_s"))
    return rates, {"timed_now": now, "rates_s": time.perf_counter() - t0, "framework": framework, "stamps": stamps}


def heap_faults(entries: list[dict], rounds: dict) -> float:
    """The page faults the step's allocations took in the rounds' replay (:mod:`ckptbench.measure.heapfaults`),
    none without a replay.  Where the rounds priced each op without its own faults (`faults_apart`: every
    round, each op's time less the faults it took in that round's timing at that round's price), all of
    them; otherwise those beyond what the ops took when timed (an op whose output is mapped afresh each call
    faults in its own timing too), never fewer than none."""
    replayed = rounds.get("heap_faults")
    if not replayed:
        return 0.0
    if rounds.get("faults_apart"):
        return float(replayed)
    per_call = rounds.get("faults_per_call") or {}
    in_ops = sum(per_call.get(e["key"], 0.0) * sum(e["counts"].values()) for e in entries if e["kind"] != "view")
    return max(0.0, replayed - in_ops)


def predict(case: Case, directory: str | None = None, threads: int | None = None, trace: list | None = None,
            rounds: dict | None = None) -> dict:
    """The step-time model's answer for `case` on this machine, as the record keeps it: from `trace` (the
    ops a real step of it ran, :class:`~ckptbench.measure.optrace.OpRecorder`) or, without one, its step
    traced on fake tensors; at the rates `rounds` timed between its steps (:mod:`.raterounds`), the
    others from the cache or timed now."""
    import torch

    from ..theory.optrace import trace_case

    threads = threads or case.train.threads
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    entries = trace if trace is not None else trace_case(case)
    traced = time.perf_counter() - t0
    cache = RateCache(directory, machine_facts(case.device, threads))
    rounds = rounds or {}
    fresh = rounds.get("per_call_s") or {}
    rates, how = measured_rates(case, entries, cache, fresh, rounds.get("probe"), rounds.get("figures"))
    # the step's faults at their price in its own pattern of allocations (the replay's), else a fresh mapping's
    rates = replace(rates, fault_s=rounds.get("heap_fault_s") or rounds.get("fault_s") or 0.0)
    cost = step_cost(entries, rates, heap_faults(entries, rounds))
    return {"predicted_s": cost.seconds, **cost.to_dict(), "framework_s_per_op": rates.framework_s_per_op,
            # the probe's figure without the point's traffic read between its modules, and that read's size
            "framework_clean_s_per_op": how["framework"].get("clean_per_op_s", rates.framework_s_per_op),
            "framework_scrub_bytes": how["framework"].get("scrub_bytes", 0),
            "framework_probe": how["framework"].get("probe"), "timed_now": how["timed_now"],
            "framework_rounds": len(how["framework"].get("rounds_per_op_s") or []),
            "framework_probe_error": rounds.get("probe_error"),
            "bandwidth_bytes_per_s": rates.bandwidth_bytes_per_s, "inplace_bytes_per_s": rates.inplace_bytes_per_s,
            "dispatch_s": rates.dispatch_s, "bandwidth_readings": rounds.get("bandwidths") or [],
            "figures_between_steps": sorted(k for k, v in (rounds.get("figures") or {}).items() if v),
            "trace": "the memory step's ops" if trace is not None else "fake-tensor trace", "trace_s": traced,
            "rates_s": how["rates_s"], "rates_file": cache.path, "measured_at": how["stamps"],
            "rate_rounds": rounds.get("rounds", 0), "rate_rounds_s": rounds.get("seconds", 0.0),
            "heap_faults_replayed": rounds.get("heap_faults"), "heap_replay": rounds.get("heap_replay"),
            "heap_faults_rounds": rounds.get("heap_faults_rounds") or [],
            "heap_fault_prices_s": rounds.get("heap_fault_prices") or [], "fault_price_s": rounds.get("fault_s"),
            "heap_fault_price_s": rates.fault_s if rounds.get("heap_faults") is not None else None,
            "timed_between_steps": sum(e["key"] in fresh for e in entries)}


class MeasuredTimer:
    """A plan's step times on this machine: each candidate carried from few-layer steps to its depth
    (:func:`ckptbench.theory.plantime.depth_extrapolated`), each of those traced on fake tensors and priced
    at the op rates measured here, kept in `directory` for the next plan."""

    def __init__(self, directory: str | None = DEFAULT_DIR, threads: int = 1):
        self.directory, self.threads = directory, threads
        self.stamps: set[str] = set()
        self.where = ""

    @property
    def source(self) -> str:
        times = sorted(self.stamps)
        when = times[0] if len(times) == 1 else f"{times[0]} to {times[-1]}" if times else "now"
        return f"op rates measured here{self.where} at {when}" + (f", kept in {self.directory}" if self.directory
                                                                 else "")

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (one timer per plan: the cache dies with it)
    def price(self, case: Case) -> float:
        p = predict(case, self.directory, self.threads)
        self.stamps.update(p["measured_at"])
        m = RateCache(None, machine_facts(case.device, self.threads)).machine
        self.where = f" ({m['device_name']}, {self.threads} thread{'s' * (self.threads > 1)}, torch {m['torch']})"
        return p["predicted_s"]

    def __call__(self, case: Case) -> float:
        return depth_extrapolated(case, self.price)
