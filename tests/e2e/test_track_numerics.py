"""A tracked run computes what it computes untracked: losses and parameters after STEPS optimizer steps are
identical, bit for bit, with and without a tracker that measured (its record ``ok``), for a plain loop,
LoRA through peft, and DDP at world 2 (gloo, two processes on this machine).  (Trainer and Accelerate are
held to the same in test_track_loggers.)"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from ckptbench.track import track

pytestmark = pytest.mark.e2e
STEPS = 12


def _model(lora: bool = False):
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=64, vocab_size=128,
                                  max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return model


def _batches(rank: int = 0):
    g = torch.Generator().manual_seed(1 + rank)
    return [torch.randint(0, 128, (2, 16), generator=g) for _ in range(STEPS)]


def _train(out=None, lora: bool = False, wrap=None, rank: int = 0):
    """STEPS optimizer steps of a plain loop, tracked into `out` when given.  (losses, parameters, record)."""
    model = _model(lora)
    trained = wrap(model) if wrap else model
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-3)
    losses = []

    def one(ids):
        loss = trained(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())

    record = None
    if out is None:
        for ids in _batches(rank):
            one(ids)
    else:
        with track(trained, optimizer, out=str(out), echo=False) as t:
            for ids in _batches(rank):
                with t.step(ids):
                    one(ids)
        record = t.record
    return losses, [p.detach().clone() for p in model.parameters()], record


def _same(plain, tracked):
    assert tracked[2] is not None and tracked[2]["status"] == "ok", tracked[2]
    assert plain[0] == tracked[0]
    assert len(plain[1]) == len(tracked[1])
    assert all(torch.equal(a, b) for a, b in zip(plain[1], tracked[1]))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_tracked_loop_trains_bit_for_bit_as_untracked(tmp_path, lora):
    pytest.importorskip("peft")
    _same(_train(lora=lora), _train(tmp_path / "records", lora=lora))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(rank: int, world: int, port: int, out: str, saved: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.nn.parallel import DistributedDataParallel

        plain = _train(wrap=DistributedDataParallel, rank=rank)
        tracked = _train(out, wrap=DistributedDataParallel, rank=rank)
        torch.save((rank, plain[0], plain[1], tracked[0], tracked[1], tracked[2]), f"{saved}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def test_a_tracked_ddp_run_at_world_2_trains_bit_for_bit_as_untracked(tmp_path):
    ctx = mp.get_context("spawn")
    port, saved = _free_port(), str(tmp_path / "rank")
    procs = [ctx.Process(target=_ddp_rank, args=(r, 2, port, str(tmp_path / "records"), saved)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    got = [torch.load(f"{saved}.{r}", weights_only=False) for r in range(2)]
    by_rank = {g[0]: g for g in got}
    assert sorted(by_rank) == [0, 1]
    for _rank, plain_losses, plain_params, losses, params, record in got:
        _same((plain_losses, plain_params, None), (losses, params, record))
        assert record["case"]["world_size"] == 2
    # DDP keeps the ranks' parameters equal; the tracker leaves that so
    assert all(torch.equal(a, b) for a, b in zip(by_rank[0][4], by_rank[1][4]))
