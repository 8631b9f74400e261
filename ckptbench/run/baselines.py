"""A plan's step times on this machine: measured baseline steps, transformed by the step-time model.

For each candidate, the model is measured without checkpointing at the candidate's batch and sequence,
shallow (one and two decoder layers; a model of two layers or fewer whole): a few real steps through the
point's own loop, each layer's forward timed in place (:class:`~ckptbench.measure.layertime.LayerClock`).
The step at the candidate's depth is the one-layer step plus the layers beyond it at the two-layer step's
difference, and the candidate's strategy adds what :func:`ckptbench.theory.time.steptime.added_s` says: each
checkpointed layer's measured forward, and offload's copies at the link.  A selective-checkpointing
candidate's checkpointed layer is measured as such (one layer, checkpointed with its policy and offload),
its recomputed share being the policy's.  Each baseline is measured once per plan and kept in memory, and
in `directory` (``baselines.json``, by machine and torch version) for the next plan; a file there that
does not read back as one is ignored, never trusted.

A one- and two-layer pair is used only when it hangs together (:func:`coherent`): the same layer's forward
within :data:`FORWARD_AGREEMENT` in both steps, and the second layer costing at least its own forward
(forward, backward and optimizer: 2.7-3.9 times it in every undisturbed pair measured here).  A short
window of five steps on a shared machine can run slow as a whole: once, the one-layer step of llama-small
at batch 3 ran 1.7 times slow (its layer's forward 0.0088 s against 0.0055 s in the two-layer step), the
second layer then cost 0.21 times its forward, and the depth carried the error twice over into a 1.7 times
too fast prediction.  A pair that does not hang together, measured now or read back, is measured again
(up to :data:`RETRIES` times; the last pair is used and the plan's source counts the retries).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
from dataclasses import replace

from ..base.finite import finite_number
from ..base.regularfile import open_regular
from ..point.case import Case
from ..point.strategy import Recompute
from ..store.files import write_text_atomic
from ..theory.time.roofline import HOST_LINK_BYTES_PER_S
from ..theory.time.steptime import added_s

WARMUP, TIMED = 2, 5
FORWARD_AGREEMENT = 0.25  # a layer's forward in the one-layer step against the two-layer step's, relative
RETRIES = 2
DIRECT_LAYERS = 2
DEFAULT_DIR = os.path.join("results", "baselines")


class _Schedule:
    """What a loop reports its steps to (as the worker's schedule): warm-up steps, then timed steps with
    each layer's forward clocked.  No memory step."""

    def __init__(self, layers: list, device, model):
        from ..measure.layertime import LayerClock
        from ..measure.timing import timer_for
        from .memory_step import MemoryStepMarks

        self.total = WARMUP + TIMED
        self.marks = MemoryStepMarks(layers)  # never started: no step is a memory step
        self.timer = timer_for(device.type)
        self.clock = LayerClock(layers, device, model)

    def __iter__(self):
        return iter(range(self.total))

    @property
    def done(self) -> bool:
        return False

    def kind(self, k: int) -> str:
        return "warmup" if k < WARMUP else "timed"

    def begin(self, k: int) -> None:
        if self.kind(k) == "timed":
            self.clock.start()
            self.timer.start()

    def end(self, k: int, loss) -> None:
        if self.kind(k) == "timed":
            self.timer.stop()
            self.clock.stop()


def measure_step(case: Case) -> dict:
    """A few real steps of `case` through its own loop: the median step and each layer's forward."""
    import torch

    from ..train.adapters import with_adapters
    from ..train.checkpointing import decoder_layers, offload_for
    from ..train.loops import loop_for
    from ..train.models import build_model, synthetic_batch

    torch.manual_seed(case.train.seed)
    torch.set_num_threads(case.train.threads)
    device = torch.device(case.device)
    with offload_for(case):
        model = with_adapters(build_model(case.model, device), case.setup.lora)
        batch = synthetic_batch(case.model.vocab, case.batch_size, case.seq_len, case.train.seed, device)
        loop = loop_for(case, model, batch)
        schedule = _Schedule(decoder_layers(model), device, model)
        loop.run(schedule)
        schedule.clock.close()
    return {"step_s": statistics.median(schedule.timer.times()), "forward_s": schedule.clock.result()["forward_s"]}


def _plain(case: Case, layers: int) -> Case:
    """One rank of `case` at `layers` deep, nothing checkpointed (its collectives are the plan's to add)."""
    return replace(case, model=replace(case.model, layers=layers), every_n_layers=0, offload=False,
                   recompute=Recompute(), world_size=1, local_sgd_steps=0)


def coherent(one: dict, two: dict) -> bool:
    """Whether a one- and two-layer baseline pair describes one undisturbed machine (see the module's text)."""
    forward = statistics.mean(two["forward_s"])
    return (abs(one["forward_s"][0] - forward) <= FORWARD_AGREEMENT * forward
            and two["step_s"] - one["step_s"] >= forward)


def machine_key() -> str:
    import platform

    import torch

    return f"{platform.machine()} {platform.processor() or platform.node()} torch {torch.__version__}"


class MeasuredTimer:
    """A plan's step times here (see the module's text): callable on a Case, with the `source` it states."""

    def __init__(self, directory: str | None = DEFAULT_DIR, threads: int = 1, link_bytes_per_s: float | None = None):
        self.directory, self.threads = directory, threads
        self.link = link_bytes_per_s or HOST_LINK_BYTES_PER_S
        self.measured = 0
        self.remeasured = 0  # baseline pairs measured again because they did not hang together
        self.kept = self._read()

    @property
    def path(self) -> str | None:
        return os.path.join(self.directory, "baselines.json") if self.directory else None

    @property
    def source(self) -> str:
        where = f", kept in {self.directory}" if self.directory else ""
        again = (f"; {self.remeasured} one- and two-layer pairs measured again (they did not hang together)"
                 if self.remeasured else "")
        return (f"measured here: steps without checkpointing at each batch and sequence (one and two layers), "
                f"transformed by the step-time model{where}{again}")

    def _read(self) -> dict:
        if not self.path or not os.path.exists(self.path):
            return {}
        try:
            with open_regular(self.path, "r", encoding="utf-8") as fh:  # a FIFO or a directory there: refused
                data = json.load(fh)
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict):
            return {}
        good = {}
        for key, value in data.items():
            if (isinstance(value, dict) and _positive(value.get("step_s"))
                    and isinstance(value.get("forward_s"), list) and all(_positive(f) for f in value["forward_s"])):
                good[key] = {"step_s": float(value["step_s"]), "forward_s": [float(f) for f in value["forward_s"]]}
        return good

    def _keep(self) -> None:
        if not self.path:
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
            write_text_atomic(self.path, json.dumps(self.kept, sort_keys=True))
        except OSError:
            pass  # a plan is answered whether or not its baselines can be kept

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (one timer per plan: the cache dies with it)
    def _key(self, case: Case) -> tuple[Case, str]:
        case = replace(case, train=replace(case.train, threads=self.threads))
        return case, f"{machine_key()} threads={self.threads} {case.id}"

    def baseline(self, case: Case, again: bool = False) -> dict:
        case, key = self._key(case)
        if again or key not in self.kept:
            self.kept[key] = measure_step(case)
            self.measured += 1
            self._keep()
        return self.kept[key]

    @functools.lru_cache(maxsize=1024)  # noqa: B019
    def pair(self, case: Case) -> tuple[dict, dict]:
        """The one- and two-layer baselines of `case`'s batch and sequence, measured again while they do not
        hang together (:func:`coherent`), at most RETRIES times."""
        one, two = self.baseline(_plain(case, 1)), self.baseline(_plain(case, 2))
        for _ in range(RETRIES):
            if coherent(one, two):
                break
            self.remeasured += 1
            one, two = self.baseline(_plain(case, 1), again=True), self.baseline(_plain(case, 2), again=True)
        return one, two

    def __call__(self, case: Case) -> float | None:
        if case.compiled or case.setup.sharding != "ddp":
            return None  # inductor's kernels, a sharded step: no eager single-rank baseline transforms into them
        layers = case.model.layers
        if layers <= DIRECT_LAYERS:
            plain = self.baseline(_plain(case, layers))
            step, forward = plain["step_s"], plain["forward_s"]
        else:
            one, two = self.pair(_plain(case, 1))
            step = one["step_s"] + (layers - 1) * (two["step_s"] - one["step_s"])
            forward = [statistics.mean(two["forward_s"])] * layers
        if case.recompute.sac:  # its policy's share recomputed: one such layer measured against a plain one
            one = self.baseline(_plain(case, 1))
            sac = self.baseline(replace(_plain(case, 1), every_n_layers=1, offload=case.offload,
                                        recompute=Recompute(sac=case.recompute.sac)))
            return step + len(case.checkpointed_layers) * max(0.0, sac["step_s"] - one["step_s"])
        return step + sum(added_s(case, forward, self.link))



def _positive(x) -> bool:
    return finite_number(x) and x > 0
