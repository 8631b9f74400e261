"""The token batches one rank of a data-parallel Case trains and evaluates on.

``random``: seeded uniform ids, a different stream per rank (what the memory and speed points have
always used; nothing to learn).  Text sources (:mod:`ckptbench.sources.corpus`) are byte-level: token id =
byte.  The training text is cut into ``world_size`` contiguous shards and rank r reads only shard r, at
window starts drawn from a generator seeded by (train seed, rank), so a seed changes both the initial
weights and the order the text is seen in.  The held-out text is read at ``eval_batches × batch_size``
evenly spaced windows that depend on nothing but the corpus, so every K and every seed is evaluated on
the same tokens; the batches are shared out round-robin over the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..point.case import Case
from ..sources.corpus import read_corpus
from .models import synthetic_batch


@dataclass
class RankData:
    batches: list[torch.Tensor]  # one (batch_size, seq_len) tensor per micro-batch
    held_out: list[torch.Tensor] = field(default_factory=list)  # this rank's share of the evaluation batches
    held_out_total: int = 0  # evaluation batches over all ranks
    random_eval: torch.Tensor | None = None  # random source: the one seeded evaluation batch
    corpus: dict | None = None  # what the text was (Corpus.summary())


def _bytes_tensor(text: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(text), dtype=torch.uint8) if text else torch.empty(0, dtype=torch.uint8)


def windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``tokens[start : start + seq_len]`` for every start (any shape), as int64 token ids."""
    return tokens[starts.unsqueeze(-1) + torch.arange(seq_len)].long()


def rank_data(case: Case, rank: int, world: int, iterations: int, device) -> RankData:
    """`iterations` training micro-batches for `rank` of `world`, and its share of the held-out batches."""
    b, s, seed = case.batch_size, case.seq_len, case.train.seed
    if case.data.source == "random":
        batches = [synthetic_batch(case.model.vocab, b, s, seed=seed * 1_000_003 + rank * 10_007 + it, device=device)
                   for it in range(iterations)]
        return RankData(batches, random_eval=synthetic_batch(case.model.vocab, b, s, seed=seed + 999_983,
                                                             device=device))
    corpus = read_corpus(case.data)
    train = _bytes_tensor(corpus.train)
    shard_len = len(train) // world
    if shard_len < s:
        raise ValueError(f"the corpus ({corpus.description}) gives each of {world} ranks {shard_len} training "
                         f"bytes, fewer than seq_len={s}")
    shard = train[rank * shard_len:(rank + 1) * shard_len]
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007)
    starts = torch.randint(0, shard_len - s + 1, (iterations, b), generator=gen)
    batches = [w.to(device) for w in windows(shard, starts, s)]

    held = _bytes_tensor(corpus.held_out)
    n_eval = case.data.eval_batches
    if len(held) < s:
        raise ValueError(f"the corpus ({corpus.description}) holds out {len(held)} bytes, fewer than seq_len={s}")
    spots = torch.linspace(0, len(held) - s, n_eval * b).long().reshape(n_eval, b)
    mine = [windows(held, spots[i], s).to(device) for i in range(rank, n_eval, world)]
    return RankData(batches, held_out=mine, held_out_total=n_eval, corpus=corpus.summary())


def eval_steps(optimizer_steps: int, eval_every: int) -> list[int]:
    """Optimizer steps after which the held-out loss is taken: 0 (before training), every `eval_every`,
    and the last step (taken after the closing averaging, so it is the model the run ends with)."""
    inner = range(eval_every, optimizer_steps, eval_every) if eval_every > 0 else []
    return [0, *inner, optimizer_steps]
