"""The strategies a plan ranks together, and the predictor that answers each.

Beside every distinct ``every_n_layers`` pattern with and without transformers' offload, a plan ranks:

- **SAC policies** (``plan --sac``): every pattern that checkpoints, with and without offload, each
  checkpointed layer under the policy (torch's selective checkpointing, :data:`~ckptbench.point.strategy.SAC_POLICIES`).
  No analytic estimate says what a policy keeps, so their peaks and FLOPs come from the few-layer FakeTensor
  simulation under that policy, extrapolated to the full depth (:mod:`..memory.extrapolate`: exact to the byte on CPU,
  and checked on a 4-layer step); :class:`PerStrategy` sends each Case to its policy's fit;
- **streamed offload** (a CUDA plan from the analytic estimate): each offloading pattern also with the saved
  inputs copied on a side stream and prefetched a layer ahead (the estimate's ``streamed`` term: one
  prefetched layer input more than transformers' offload in the layers' backward); its step time counts
  the copies that one layer's compute cannot hide (:func:`..time.plantime.streamed_hidden_s`);
- **layer sets** (``plan --layer-sets``, :mod:`..memory.layersets`).

What a plan cannot rank is said, never left out silently (:data:`NOT_RANKED`): a compile budget's peak is
what torch.compile's partitioner chooses when it compiles, which nothing predicts before it runs.
"""

from __future__ import annotations

from ...point.strategy import Recompute
from ..memory.extrapolate import patterns

NOT_RANKED = {
    "compile-budget": "not ranked: torch.compile's partitioner decides what a budget saves only when it compiles, "
                      "so no estimate or simulation gives its peak before a run; measure the budgets with a "
                      "sweep (compile_budget = [0, 0.25, 0.5, 0.75, 1.0])",
}


def strategies(layers: int) -> list[tuple[int, bool]]:
    """(every_n_layers, offload) for each distinct set of checkpointed layers, with and without offload."""
    return [(0, False)] + [(n, off) for n, _ in patterns(layers)[1:] for off in (False, True)]


def candidates(layers: int, sac: tuple[str, ...] = (), streamed: bool = False) -> list[tuple[int, bool, Recompute]]:
    """(every_n_layers, offload, recompute) of each strategy to rank: :func:`strategies` (each offload also
    streamed, where asked), then each SAC policy on every pattern that checkpoints, with and without offload."""
    out = []
    for n, off in strategies(layers):
        out.append((n, off, Recompute()))
        if streamed and off:
            out.append((n, True, Recompute(offload="streamed")))
    return out + [(n, off, Recompute(sac=policy)) for policy in sac for n, off in strategies(layers) if n]


class PerStrategy:
    """The plan's predictor when it ranks SAC policies: a Case checkpointing under a policy is answered by
    that policy's fit (:class:`..memory.extrapolate.Simulated`), every other Case by `base` (the analytic estimate,
    or the plain few-layer fit)."""

    def __init__(self, base, by_policy: dict):
        self.base, self.by_policy = base, dict(by_policy)
        self.source = "; ".join([base.source] + [f"SAC policy {p}: {s.source}" for p, s in self.by_policy.items()])

    def _for(self, case):
        return self.by_policy[case.recompute.sac] if case.recompute.sac and case.checkpointed_layers else self.base

    def max_seq_unknown(self) -> list[str]:
        return [*self.base.max_seq_unknown(), *(f"SAC policy {p}: {why}" for p, s in self.by_policy.items()
                                                for why in s.max_seq_unknown())]

    def peak(self, case) -> int:
        return self._for(case).peak(case)

    def peak_phase(self, case) -> str:
        return self._for(case).peak_phase(case)

    def offloaded(self, case) -> int:
        return self._for(case).offloaded(case)

    def params_bytes(self, case) -> int:
        return self.base.params_bytes(case)

    def flops(self, case) -> tuple[float, float]:
        return self._for(case).flops(case)


class ShardedPerStrategy(PerStrategy):
    """An FSDP2 plan that ranks SAC policies: one rank's peak is the sharded estimate of the Case with its
    layers checkpointed plainly (:class:`.plan.ShardedAnalytic`), plus what the policy keeps beyond plain
    checkpointing on one unsharded rank at the same local batch (the policy's few-layer fit less the
    analytic estimate of the plain Case).  An approximation: the two peaks are taken to fall at the same
    moment of the step; the FLOPs are the policy's, the collectives FSDP2's."""

    def __init__(self, sharded, plain, by_policy: dict):
        super().__init__(sharded, by_policy)
        self.plain = plain
        self.source = ("; ".join([sharded.source] + [f"SAC policy {p}: {s.source}, its excess over plain "
                                                     "checkpointing added to the sharded rank"
                                                     for p, s in self.by_policy.items()]))

    def peak(self, case) -> int:
        from dataclasses import replace

        if not (case.recompute.sac and case.checkpointed_layers):
            return self.base.peak(case)
        plain = replace(case, recompute=replace(case.recompute, sac=""))
        return self.base.peak(plain) + self.by_policy[case.recompute.sac].peak(case) - self.plain.peak(plain)

    def collectives(self, case) -> tuple[int, float]:
        return self.base.collectives(case)
