"""Suite parsing, validation messages and Case expansion."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from ckptbench.point.case import Case, preset
from ckptbench.point.training import Timing, TrainSpec
from ckptbench.suite import parse as suite_mod
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import load_suite, parse_suite

BASE = {
    "model": 'preset = "llama-tiny"',
    "sweep": "batch_size = [1, 2]\nseq_len = [32]\nevery_n_layers = [0, 1, 2]\noffload = [false, true]",
}


def suite_text(**tables: str) -> str:
    merged = {**BASE, **tables}
    return "\n".join(f"[{name}]\n{body}" for name, body in merged.items() if body is not None)


def test_expansion_skips_offload_without_checkpointing():
    s = parse_suite(suite_text(), "x.toml")
    # 2 batches x 1 seq x (every_n 0 without offload + every_n 1,2 with and without offload) = 2 x 5
    assert len(s.cases) == 10
    assert not any(c.offload and c.every_n_layers == 0 for c in s.cases)
    assert [c.strategy for c in s.cases[:5]] == ["none", "full", "full+offload", "every-2", "every-2+offload"]


def test_case_ids_are_stable_and_distinct():
    a = parse_suite(suite_text(), "x.toml")
    b = parse_suite(suite_text(), "y.toml")
    assert [c.id for c in a.cases] == [c.id for c in b.cases]
    assert len({c.id for c in a.cases}) == len(a.cases)
    case = a.cases[0]
    assert Case.from_dict(case.to_dict()) == case
    assert Case.from_dict(case.to_dict()).id == case.id


def test_timing_at_its_defaults_keeps_every_id_and_any_other_timing_is_another_point():
    plain = parse_suite(suite_text(), "x.toml")
    same = parse_suite(suite_text(train="time_precision = 0.02\nmax_steps = 50\nmax_time_s = 20"), "x.toml")
    assert [c.id for c in same.cases] == [c.id for c in plain.cases]
    assert plain.cases[0].train.timing == Timing()
    # the id a Case of these settings had before timing was a setting: TrainSpec's fields without it
    assert Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=32).id == "826c30dcc00f"
    for table in ("time_precision = 0.05", "max_steps = 8", "max_time_s = 5"):
        other = parse_suite(suite_text(train=table), "x.toml")
        assert not {c.id for c in other.cases} & {c.id for c in plain.cases}
        assert all(Case.from_dict(c.to_dict()) == c and Case.from_dict(c.to_dict()).id == c.id for c in other.cases)
    loose = parse_suite(suite_text(train="steps = 2\ntime_precision = 0.1\nmax_steps = 9\nmax_time_s = 4"), "x.toml")
    assert loose.cases[0].train.timing == Timing(precision=0.1, max_steps=9, max_time_s=4.0)


def test_case_id_changes_with_any_setting():
    base = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    variants = [
        Case(model=preset("llama-tiny", dtype="bf16"), train=TrainSpec(), batch_size=1, seq_len=8),
        Case(model=preset("llama-tiny"), train=TrainSpec(steps=9), batch_size=1, seq_len=8),
        Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8, every_n_layers=1),
    ]
    assert len({base.id, *(v.id for v in variants)}) == 4


def test_checkpointed_layers_follow_transformers_rule():
    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8, every_n_layers=3)
    assert case.checkpointed_layers == [0, 3]


def test_explicit_dimensions_and_label():
    model = ('family = "qwen2"\nhidden = 32\nlayers = 2\nheads = 4\nkv_heads = 2\nintermediate = 64\n'
             'vocab = 128\nlabel = "my model"\ndtype = "bf16"\nattn = "sdpa"')
    s = parse_suite(suite_text(model=model), "x.toml")
    m = s.cases[0].model
    assert (m.family, m.hidden, m.layers, m.kv_heads, m.name, m.dtype, m.attn) == (
        "qwen2", 32, 2, 2, "my model", "bf16", "sdpa")


BAD = [
    ("unknown table", {"extra": "a = 1"}, "extra", "unknown table"),
    ("unknown key", {"train": "stepz = 3"}, "train.stepz", "unknown key"),
    ("wrong type", {"train": 'steps = "3"'}, "train.steps", "must be integer"),
    ("bool is not int", {"train": "steps = true"}, "train.steps", "must be integer"),
    ("axis wrong type", {"sweep": 'batch_size = ["a"]\nseq_len = [8]'}, "sweep.batch_size", "integers"),
    ("empty axis", {"sweep": "batch_size = []\nseq_len = [8]"}, "sweep.batch_size", "empty"),
    ("missing axis", {"sweep": "batch_size = [1]"}, "sweep.seq_len", "missing"),
    ("negative", {"sweep": "batch_size = [-1]\nseq_len = [8]"}, "sweep.batch_size", "> 0"),
    ("zero", {"sweep": "batch_size = [1]\nseq_len = [0]"}, "sweep.seq_len", "> 0"),
    ("zero steps", {"train": "steps = 0"}, "train.steps", "> 0"),
    ("every_n too large", {"sweep": "batch_size = [1]\nseq_len = [8]\nevery_n_layers = [5]"},
     "sweep.every_n_layers", "larger than"),
    ("offload without ckpt", {"sweep": "batch_size = [1]\nseq_len = [8]\noffload = [true]"},
     "sweep.offload", "needs checkpointing"),
    ("duplicate", {"sweep": "batch_size = [1, 1]\nseq_len = [8]"}, "sweep.batch_size", "duplicate"),
    ("heads", {"model": 'preset = "llama-tiny"\nheads = 3'}, "model.heads", "does not divide"),
    ("kv heads", {"model": 'preset = "llama-tiny"\nkv_heads = 3'}, "model.kv_heads", "does not divide"),
    ("family", {"model": 'preset = "llama-tiny"\nfamily = "t5"'}, "model.family", "knows no causal LM of model_type"),
    ("dtype", {"model": 'preset = "llama-tiny"\ndtype = "fp8"'}, "model.dtype", "unknown dtype"),
    ("attn", {"model": 'preset = "llama-tiny"\nattn = "flash"'}, "model.attn", "unknown attention"),
    ("preset", {"model": 'preset = "llama-999b"'}, "model.preset", "unknown preset"),
    ("no dims", {"model": 'family = "llama"'}, "model.hidden", "missing"),
    ("seq too long", {"sweep": "batch_size = [1]\nseq_len = [4096]"}, "sweep.seq_len", "max_positions"),
    ("local sgd alone", {"sweep": "batch_size = [1]\nseq_len = [8]\nlocal_sgd_steps = [4]"},
     "sweep.local_sgd_steps", "world_size > 1"),
    ("device", {"suite": 'device = "tpu"'}, "suite.device", "unknown device"),
    ("timeout", {"suite": "timeout_s = 0"}, "suite.timeout_s", "> 0"),
    ("optimizer", {"train": 'optimizer = "lion"'}, "train.optimizer", "unknown optimizer 'lion'"),
    ("optimizer axis", {"sweep": 'batch_size = [1]\nseq_len = [8]\noptimizer = ["sgd", "adam"]'},
     "sweep.optimizer", "unknown optimizer 'adam'"),
    ("sharding", {"train": 'sharding = "zero3"'}, "train.sharding", "unknown sharding"),
    ("lora not a table", {"train": "lora = 8"}, "train.lora", "must be a table"),
    ("extra not a table", {"model": "preset = \"llama-tiny\"\nextra = 1"}, "model.extra", "must be a table"),
    ("lora key", {"train": "lora = { rank = 8 }"}, "train.lora.rank", "unknown key"),
    ("lora r", {"train": "lora = { r = 0 }"}, "train.lora.r", "> 0"),
    ("lora r type", {"train": 'lora = { r = "8" }'}, "train.lora.r", "must be an integer"),
    ("lora dropout", {"train": "lora = { dropout = 1.0 }"}, "train.lora.dropout", "[0, 1)"),
    ("lora targets", {"train": 'lora = { targets = ["q_proj", "q_proj"] }'}, "train.lora.targets", "twice"),
    ("lora quantize", {"train": 'lora = { quantize = "int3" }'}, "train.lora.quantize", "unknown quantization"),
    ("lora axis", {"sweep": "batch_size = [1]\nseq_len = [8]\nlora_r = [-4]"}, "sweep.lora_r", ">= 0"),
    ("nan budget", {"suite": "memory_budget_gib = nan"}, "suite.memory_budget_gib", "finite"),
    ("inf timeout", {"suite": "timeout_s = inf"}, "suite.timeout_s", "finite"),
    ("inf budgets", {"suite": "budgets_gib = [inf]"}, "suite.budgets_gib", "positive numbers"),
    ("seq 1", {"sweep": "batch_size = [1]\nseq_len = [1]"}, "sweep.seq_len", ">= 2"),
    ("time precision zero", {"train": "time_precision = 0"}, "train.time_precision", "> 0"),
    ("time precision one", {"train": "time_precision = 1.5"}, "train.time_precision", "below 1"),
    ("time precision nan", {"train": "time_precision = nan"}, "train.time_precision", "finite"),
    ("time precision type", {"train": 'time_precision = "2%"'}, "train.time_precision", "must be number"),
    ("max steps below steps", {"train": "steps = 5\nmax_steps = 4"}, "train.max_steps", ">= train.steps (5)"),
    ("max steps zero", {"train": "max_steps = 0"}, "train.max_steps", "> 0"),
    ("max time zero", {"train": "max_time_s = 0"}, "train.max_time_s", "> 0"),
    ("max time past timeout", {"suite": "timeout_s = 60", "train": "max_time_s = 60"}, "train.max_time_s",
     "below suite.timeout_s (60)"),
    # the name makes the default --out, results/<name>-<time>: nothing outside results/, nothing odd
    *[(f"name {why}", {"suite": f"name = {toml}"}, "suite.name", "letters, digits")
      for why, toml in [("parent", '"../../x"'), ("dot dot", '".."'), ("absolute", '"/tmp/x"'),
                        ("separator", '"a/b"'), ("backslash", '"a\\\\b"'), ("newline", '"a\\nb"'),
                        ("trailing newline", '"x\\n"'), ("nul", '"a\\u0000b"'), ("escape", '"a\\u001b[2Jb"'),
                        ("tab", '"a\\tb"'), ("space", '"a b"'), ("hidden", '".x"'), ("empty", '""'),
                        ("too long", f'"{"x" * 101}"')]],
]


@pytest.mark.parametrize("name,tables,key,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_suites_name_file_key_and_reason(name, tables, key, reason):
    with pytest.raises(SuiteError) as err:
        parse_suite(suite_text(**tables), "bad.toml")
    assert err.value.path == "bad.toml"
    assert err.value.key == key
    assert reason in err.value.reason
    assert str(err.value).startswith(f"bad.toml: {key}: ")


def test_names_that_make_a_plain_directory_name_parse():
    for name in ("gpu-8b", "a.b_c-1", "X" * 100):
        assert parse_suite(suite_text(suite=f'name = "{name}"'), "x.toml").name == name
    assert parse_suite(suite_text(), "dir/x.toml").name == "x"  # no name: the file's


def test_invalid_toml():
    with pytest.raises(SuiteError) as err:
        parse_suite("[sweep\nbatch_size = 1", "broken.toml")
    assert err.value.key == "(file)" and "invalid TOML" in err.value.reason


def test_unreadable_file(tmp_path):
    with pytest.raises(SuiteError) as err:
        load_suite(str(tmp_path / "missing.toml"))
    assert "cannot read" in err.value.reason


def test_world_size_without_launcher(monkeypatch):
    monkeypatch.setattr(suite_mod, "launcher_available", lambda: False)
    with pytest.raises(SuiteError) as err:
        parse_suite(suite_text(sweep="batch_size = [1]\nseq_len = [8]\nworld_size = [2]"), "ws.toml")
    assert err.value.key == "sweep.world_size" and "torchrun" in err.value.reason


def test_memory_budget_and_budgets():
    s = parse_suite(suite_text(suite="memory_budget_gib = 0.5\nbudgets_gib = [1, 2.5]"), "x.toml")
    assert s.memory_budget_bytes == 2**29
    assert s.budgets_gib == (1.0, 2.5)


@pytest.mark.parametrize("text,key", [
    ("[sweep]\nbatch_size = [1]\nseq_len = [8]\nevery_n_layers = [2, 2]\n[model]\npreset='llama-tiny'",
     "sweep.every_n_layers"),
    ("[sweep\n", "(file)"),
])
def test_cli_exits_2_with_one_line_and_no_traceback(tmp_path, text, key):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {path}: {key}: ")


def test_a_name_outside_results_is_refused_before_a_dry_run(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(suite_text(suite='name = "../../escaped"'))
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", str(path), "--dry-run"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {path}: suite.name: must be 1 to 100 letters, digits")
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""


def test_dry_run_lists_cases_without_running(tmp_path, write_suite):
    path = write_suite()
    out = tmp_path / "never"
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--dry-run",
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "2 cases" in proc.stdout and "nothing was run" in proc.stdout
    assert not out.exists()


def test_shipped_suites_parse():
    smoke = load_suite("suites/smoke.toml")
    cpu = load_suite("suites/cpu.toml")
    assert len(smoke.cases) == 5
    assert len(cpu.cases) >= 12
    for path in glob.glob("suites/*.toml"):  # each named for its file, a name the rule above allows
        assert load_suite(path).name == os.path.splitext(os.path.basename(path))[0]


@pytest.mark.parametrize("flag,value", [("--timeout", "nan"), ("--timeout", "-1"), ("--max-minutes", "inf")])
def test_cli_rejects_non_positive_or_non_finite_limits(write_suite, flag, value):
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", write_suite(), flag, value,
                           "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "finite number > 0" in proc.stderr


def test_out_that_is_a_file_and_report_into_a_directory(tmp_path, write_suite):
    afile = tmp_path / "file"
    afile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", write_suite(), "--out",
                           str(afile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "is a file" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "report", str(tmp_path), "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr


def test_transformers_older_than_the_checkpointing_api_is_refused_in_one_line():
    from ckptbench.base.env import MIN_TRANSFORMERS, unsupported_transformers

    assert unsupported_transformers("5.23.0") is None and unsupported_transformers(MIN_TRANSFORMERS) is None
    reason = unsupported_transformers("5.16.0")  # has every_n_layers but no offload
    assert reason.startswith("transformers 5.16.0 is older than 5.17") and "\n" not in reason
    assert "pip install 'transformers>=5.17'" in reason
    assert unsupported_transformers("4.57.1") is not None


def test_fp32_sdpa_on_cuda_is_refused_with_the_reason():
    text = '[suite]\ndevice = "cuda"\n[model]\npreset = "llama-tiny"\nattn = "sdpa"\n[sweep]\nbatch_size = [1]\nseq_len = [8]\n'
    with pytest.raises(SuiteError) as err:
        parse_suite(text, "x.toml")
    assert err.value.key == "model.attn" and "math kernel" in err.value.reason
    parse_suite(text.replace('attn = "sdpa"', 'attn = "sdpa"\ndtype = "bf16"'), "x.toml")


def _huge_suite() -> str:
    axis = lambda lo, hi: "[" + ", ".join(map(str, range(lo, hi))) + "]"  # noqa: E731
    return (f'[suite]\nname = "huge"\n[model]\npreset = "llama-tiny"\n[sweep]\nbatch_size = {axis(1, 1001)}\n'
            f"seq_len = {axis(2, 1002)}\n")  # 1,000,000 points


@pytest.mark.slow
def test_a_million_point_sweep_is_counted_not_listed_and_runs_only_with_yes(write_suite, tmp_path):
    # the subprocess timeouts are the only clocks here: a plan of 10**6 points is counted, projected and
    # refused in seconds (the first version took 64 s to print 10**6 lines)
    path = write_suite(_huge_suite())
    dry = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0
    lines = dry.stdout.splitlines()
    assert lines[:2] == ["  1000000  none", f"1000000 cases (of 1000000 in {path}); nothing was run; --list prints each"]
    assert lines[2].startswith("projected duration ") and lines[2].split()[3] == "h"  # hours of work
    assert lines[3].startswith("memory: estimates not checked for more than 10,000 points here")
    out = tmp_path / "never"
    run = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and not out.exists()
    assert run.stderr.strip().splitlines()[-1] == ("error: 1000000 points to run (more than 10,000): look at them "
                                                   "with --dry-run, then pass --yes to run them")


def test_list_prints_every_case_with_its_id(write_suite):
    path = write_suite()
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, "--dry-run", "--list"],
                          capture_output=True, text=True, timeout=60)
    ids = {c.id for c in load_suite(path).cases}
    assert proc.returncode == 0 and {line.split()[0] for line in proc.stdout.splitlines()[:-3]} == ids


def _wide_suite(n: int, extra: str = "") -> str:
    return (f'[model]\npreset = "llama-tiny"\nattn = "eager"\n{extra}[sweep]\n'
            f"batch_size = {list(range(1, n + 1))}\nseed = {list(range(n))}\nseq_len = [8]\n")


def test_a_suite_too_large_to_hold_is_refused_before_a_case_is_built(monkeypatch):
    def no_case(**kw):
        raise AssertionError("a Case was built")

    monkeypatch.setattr(suite_mod, "Case", no_case)
    with pytest.raises(SuiteError) as err:
        parse_suite(_wide_suite(10_000), "wide.toml")  # 10^8 points: 60 GB of Cases
    assert str(err.value).startswith("wide.toml: sweep.") and "cross to 100,000,000 points" in str(err.value)


def test_duplicate_values_are_found_in_one_pass():
    class Counted(int):  # an int whose comparisons are counted
        eq = 0

        def __eq__(self, other):
            Counted.eq += 1
            return int.__eq__(self, other)

        __hash__ = int.__hash__

    values = [Counted(i) for i in range(1, 3001)] + [Counted(3000)]
    with pytest.raises(SuiteError, match="sweep.batch_size: duplicate value 3000"):
        suite_mod._Checker("s.toml").axis({"batch_size": values}, "batch_size")
    assert Counted.eq <= 2 * len(values)  # list.count per value made 9 million


def test_an_absurd_depth_is_refused_in_one_line():
    with pytest.raises(SuiteError, match=r"model.layers: 100,000 layers is more than 10,000"):
        parse_suite(_wide_suite(1, "layers = 100000\n"), "deep.toml")


ID_LLAMA_TINY_B2_S32, ID_LLAMA_TINY_B2_S32_BF16_TRAINER = "7205cdfd793f", "067a7b9eff0c"  # as stored


def test_setup_axes_cross_into_setups_and_name_the_points():
    sweep = ('batch_size = [1]\nseq_len = [8]\nlora_r = [0, 4]\noptimizer = ["adamw", "sgd"]\n'
             'world_size = [1, 2]\nsharding = ["ddp", "fsdp"]')
    train = 'lora = { alpha = 32, targets = ["q_proj", "v_proj"] }'
    s = parse_suite(suite_text(sweep=sweep, train=train), "x.toml")
    names = sorted(c.strategy for c in s.cases)
    # fsdp is left out on one rank (nothing to shard), as offload is without checkpointing
    assert "none+fsdp2+lora4+sgd" in names and not any("fsdp" in n and "+ddp" in n for n in names)
    assert sum(c.world_size == 1 for c in s.cases) == 4 and sum(c.world_size == 2 for c in s.cases) == 8
    lora = next(c.setup.lora for c in s.cases if c.setup.lora)
    assert (lora.r, lora.alpha, lora.targets, lora.dropout, lora.quantize) == (4, 32, ("q_proj", "v_proj"), 0.0, "")
    assert not any(c.setup.lora for c in s.cases if "lora" not in c.strategy)


def test_new_setup_fields_keep_old_ids_and_round_trip():
    from ckptbench.point.case import Case
    from ckptbench.point.setup import Lora, Setup
    from ckptbench.point.training import TrainSpec

    plain = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=32)
    mixed = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=32,
                 setup=Setup(autocast="bf16", loop="trainer"))
    # ids of points stored before the setup had adapters, sharding or an optimizer choice
    assert (plain.id, mixed.id) == (ID_LLAMA_TINY_B2_S32, ID_LLAMA_TINY_B2_S32_BF16_TRAINER)
    lora = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=2, seq_len=32,
                setup=Setup(lora=Lora(r=8, targets=("q_proj",)), optimizer="sgd"))
    assert lora.id != plain.id and Case.from_dict(lora.to_dict()) == lora
    old = {**plain.to_dict(), "train": {**plain.to_dict()["train"], "optimizer": "adamw"}}
    assert Case.from_dict(old) == plain  # a stored record's train table still names its optimizer
