"""What each rank trains and evaluates on: random ids as before, or its own shard of the text."""

import torch

from ckptbench.point.case import Case, DataSpec, preset
from ckptbench.point.training import TrainSpec
from ckptbench.sources.corpus import read_corpus
from ckptbench.train.data import eval_steps, rank_data
from ckptbench.train.models import synthetic_batch

TEXT = DataSpec(source="stdlib", eval_batches=5)


def case(data=TEXT, seed=0) -> Case:
    return Case(model=preset("llama-tiny"), train=TrainSpec(seed=seed), batch_size=3, seq_len=16, world_size=2,
                local_sgd_steps=4, data=data)


def test_random_source_keeps_the_batches_it_always_had():
    c = case(DataSpec())
    d = rank_data(c, rank=1, world=2, iterations=3, device="cpu")
    assert torch.equal(d.batches[2], synthetic_batch(256, 3, 16, seed=0 * 1_000_003 + 1 * 10_007 + 2))
    assert torch.equal(d.random_eval, synthetic_batch(256, 3, 16, seed=999_983))
    assert d.held_out == [] and d.corpus is None


def _occurs(haystack: bytes, window: torch.Tensor) -> bool:
    return bytes(window.to(torch.uint8).tolist()) in haystack


def test_each_rank_reads_only_its_shard_of_the_training_text():
    corpus = read_corpus(TEXT)
    half = len(corpus.train) // 2
    shards = [corpus.train[:half], corpus.train[half:2 * half]]
    for rank in (0, 1):
        d = rank_data(case(), rank, 2, iterations=4, device="cpu")
        assert len(d.batches) == 4 and d.batches[0].shape == (3, 16) and d.batches[0].dtype == torch.int64
        for b in d.batches:
            assert all(_occurs(shards[rank], w) for w in b)


def test_seeds_change_the_order_but_not_the_held_out_tokens():
    a = rank_data(case(seed=0), 0, 2, iterations=2, device="cpu")
    b = rank_data(case(seed=1), 0, 2, iterations=2, device="cpu")
    assert not torch.equal(a.batches[0], b.batches[0])
    assert all(torch.equal(x, y) for x, y in zip(a.held_out, b.held_out))
    held = read_corpus(TEXT).held_out
    assert all(_occurs(held, w) for batch in a.held_out for w in batch)


def test_held_out_batches_are_shared_out_over_the_ranks():
    r0 = rank_data(case(), 0, 2, iterations=1, device="cpu")
    r1 = rank_data(case(), 1, 2, iterations=1, device="cpu")
    assert (len(r0.held_out), len(r1.held_out)) == (3, 2) and r0.held_out_total == 5
    assert not torch.equal(r0.held_out[0], r1.held_out[0])


def test_evaluations_at_fixed_steps():
    assert eval_steps(300, 25) == [0, 25, 50, 75, 100, 125, 150, 175, 200, 225, 250, 275, 300]
    assert eval_steps(10, 4) == [0, 4, 8, 10]
    assert eval_steps(10, 0) == [0, 10]
