"""What plan --optimize hands over runs: policy.py applied to a transformers model, TrainingArguments, a suite."""

from __future__ import annotations

import importlib.util

import pytest

from ckptbench.cli.handover import every_n_of, policy_file, suite_file, training_arguments
from ckptbench.point.case import preset
from ckptbench.point.strategy import Recompute
from ckptbench.suite.parse import parse_suite


def _load(path):
    spec = importlib.util.spec_from_file_location("policy_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _saved_bytes(model, ids) -> tuple[int, float]:
    """Bytes autograd saves in one forward of `model` (a checkpointed layer saves its input only), and the loss
    after a backward."""
    import torch

    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return sum(saved), float(loss.detach())


@pytest.mark.parametrize("layers,sac", [((0, 1, 3), ""), ((2,), "save-matmuls")])
def test_the_policy_file_checkpoints_what_the_suite_point_checkpoints(tmp_path, layers, sac):
    import torch

    from ckptbench.train.checkpointing import decoder_layers, enable_checkpointing
    from ckptbench.train.models import build_model

    path = tmp_path / "policy.py"
    path.write_text(policy_file("A test policy.", "a test", layers, False, sac, 2))
    policy = _load(path)
    spec = preset("llama-tiny", attn="sdpa")
    ids = torch.randint(0, spec.vocab, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    mine = policy.apply(build_model(spec))
    torch.manual_seed(0)
    theirs = build_model(spec)
    enable_checkpointing(theirs, 0, False, Recompute(layers=layers, sac=sac))
    assert [b.gradient_checkpointing for b in decoder_layers(mine)] == [i in layers for i in range(spec.layers)]
    assert [b.gradient_checkpointing for b in decoder_layers(mine)] == [b.gradient_checkpointing
                                                                        for b in decoder_layers(theirs)]
    (mine_saved, mine_loss), (their_saved, their_loss) = _saved_bytes(mine, ids), _saved_bytes(theirs, ids)
    assert mine_saved == their_saved and mine_loss == their_loss
    torch.manual_seed(0)
    plain_saved, _ = _saved_bytes(build_model(spec), ids)
    assert mine_saved < plain_saved  # something is recomputed instead of kept


def test_training_arguments_where_transformers_can_say_it():
    assert every_n_of((0, 2), 4) == 2 and every_n_of((0, 1, 2, 3), 4) == 1 and every_n_of((1, 2), 4) is None
    assert training_arguments((0, 2), 4, True, "", 3) == {
        "per_device_train_batch_size": 3, "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"use_reentrant": False, "every_n_layers": 2, "offload": True}}
    assert training_arguments((), 4, False, "", 5) == {"per_device_train_batch_size": 5}
    assert training_arguments((1, 2), 4, False, "", 1) is None  # a layer set: policy.py
    assert training_arguments((0, 2), 4, False, "save-matmuls", 1) is None  # a SAC policy: a function


def test_training_arguments_run_in_transformers():
    from transformers import TrainingArguments

    kwargs = training_arguments((0, 2), 4, False, "", 3)
    args = TrainingArguments(output_dir="unused", report_to=[], **kwargs)
    assert args.activation_checkpointing and args.activation_checkpointing_kwargs["every_n_layers"] == 2


def test_the_suite_file_is_the_policy():
    text = suite_file("plan-optimum", "cpu", ['preset = "llama-small"', 'dtype = "fp32"'], ['loop = "manual"'],
                      4, 128, (0, 1, 3), False, "", 0.08)
    (case,) = parse_suite(text, "test").cases
    assert (case.batch_size, case.seq_len, case.checkpointed_layers, case.offload) == (4, 128, [0, 1, 3], False)
    text = suite_file("plan-optimum", "cpu", ['preset = "llama-small"'], [], 2, 64, (0, 2), False, "", every_n=2)
    (case,) = parse_suite(text, "test").cases
    assert case.every_n_layers == 2 and case.checkpointed_layers == [0, 2]
    (case,) = parse_suite(suite_file("plan-optimum", "cpu", ['preset = "llama-small"'], [], 2, 64, (), False, ""),
                          "test").cases
    assert case.checkpointed_layers == []


def test_a_found_policy_is_named_as_transformers_would_say_it():
    from ckptbench.cli.handover import policy_name
    from ckptbench.theory.policy.optimize import Solution

    def name(layers, mode=""):
        return policy_name(Solution(1, mode, layers, 1.0, 1.0, 1, depth=4))

    assert [name(()), name((0, 2)), name((0, 1, 2, 3), "offload"), name((1, 2), "sac-save-matmuls")] == [
        "none", "every-2", "full+offload", "layers-1,2+sac-save-matmuls"]
