"""``ckptbench env`` on this machine, the record's env being its JSON, the default suite announced before
anything runs, and the attention transformers picks recorded and shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckptbench.base.errors import UsageError
from ckptbench.cli import build_parser
from ckptbench.cli.default_suite import default_sweep
from ckptbench.cli.sweep import cmd_sweep
from ckptbench.report.render import render_report
from ckptbench.run.machine import Machine
from ckptbench.run.sweep import SweepOptions, run_sweep
from ckptbench.store.records import load_records
from ckptbench.suite.parse import load_suite, parse_suite
from ckptbench.theory.verdicts.annotate import annotate_record

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
LABELS = ("ckptbench", "platform", "CPU", "torch", "transformers", "accelerate", "devices", "NVML",
          "pinned memory", "torchrun", "default suite", "GPU suite")
# what a sweep adds per point beside the machine's env: load as it ended and the threads the point used
PER_POINT = {"load_average", "torch_threads", "thread_env"}


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptbench", *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


@pytest.fixture(scope="module")
def env_json() -> dict:
    proc = _cli("env", "--json")
    assert proc.returncode in (0, 3), proc.stderr
    return json.loads(proc.stdout)


def test_env_screen_says_every_fact_once_and_exits_by_the_rule(env_json):
    proc = _cli("env")
    lines = proc.stdout.splitlines()
    assert [line[:14].strip() for line in lines] == list(LABELS)
    torch_line = lines[LABELS.index("torch")]
    assert torch_line.split()[1] == torch.__version__
    assert torch_line.endswith("CPU-only build") == (torch.version.cuda is None)
    assert lines[LABELS.index("default suite")].split()[2] == ("suites/gpu-small.toml" if CUDA else "suites/cpu.toml")
    # exit 3 only when something would stop the default suite: on a CPU machine with a CPU torch, nothing
    assert proc.returncode == (3 if env_json["nvml_devices"] and not CUDA else 0), proc.stderr
    assert (proc.stderr == "") == (proc.returncode == 0)  # a reason on stderr exactly when it exits 3


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_env_gpu_exits_3_with_the_reason_where_no_gpu_suite_can_run(env_json):
    proc = _cli("env", "--gpu")
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == [f"error: a GPU suite cannot run here: {env_json['gpu_problem']}"]
    assert proc.stdout.splitlines()[-1] == f"GPU suite      cannot run here: {env_json['gpu_problem']}"


def test_env_json_is_what_every_record_keeps(env_json, tmp_path, write_suite):
    suite = load_suite(write_suite())
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path)))
    records = load_records(str(tmp_path)).records
    assert records and all(r["status"] == "ok" for r in records)
    for r in records:
        assert set(r["env"]) == set(env_json) | PER_POINT
        for key in ("torch_version", "transformers_version", "cuda_runtime", "cuda_available", "checkpointing_api",
                    "nvml", "torchrun", "cpu", "python", "gpu_problem", "transformers_problem"):
            assert r["env"][key] == env_json[key], key
    if not CUDA:  # a CPU-only torch says why it cannot pin (transformers' offload then runs unpinned)
        assert env_json["pinned_memory"].startswith("unavailable: ") and env_json["cuda_runtime"] is None


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_sweep_without_a_suite_announces_the_cpu_suite_first():
    proc = _cli("sweep", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("default suite: suites/cpu.toml — ")
    cpu = load_suite(str(ROOT / "suites" / "cpu.toml"))
    assert f"{len(cpu.cases)} cases (of {len(cpu.cases)} in suites/cpu.toml); nothing was run" in proc.stdout


def _args(*argv: str):
    return build_parser().parse_args(["sweep", *argv])


def test_a_cuda_machine_gets_the_gpu_suite(capsys, monkeypatch):
    """The probe injected: a machine whose torch sees an H200 (the sweep itself is a dry run here)."""
    monkeypatch.chdir(ROOT)
    h200 = Machine(nvidia_gpus=("NVIDIA H200 (139.8 GiB)",), nvml="driver 570.86.15", driver_cuda="12.8",
                   torch_version="2.13.0+cu128", torch_cuda="12.8", cuda_devices=("cuda:0 NVIDIA H200 (139.8 GiB)",))
    defaults = _args().flag_defaults
    assert default_sweep(_args("--dry-run"), cmd_sweep, defaults, machine=h200) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[0].startswith("default suite: suites/gpu-small.toml — CUDA: cuda:0 NVIDIA H200")
    gpu = load_suite(str(ROOT / "suites" / "gpu-small.toml"))
    assert f"{len(gpu.cases)} cases (of {len(gpu.cases)} in suites/gpu-small.toml)" in out
    # the GPU default is scripts/gpu_check.sh: flags it cannot honour are refused before anything runs
    with pytest.raises(UsageError, match=r"for --shard name the suite: --suite suites/gpu-small.toml"):
        default_sweep(_args("--shard", "1/2"), cmd_sweep, defaults, machine=h200)
    capsys.readouterr()
    cpu_torch = Machine(nvidia_gpus=h200.nvidia_gpus, nvml=h200.nvml, driver_cuda="12.8", torch_version="2.13.0+cpu")
    assert default_sweep(_args("--dry-run"), cmd_sweep, defaults, machine=cpu_torch) == 0
    out, err = capsys.readouterr()
    first, warning = err.splitlines()[:2]
    assert first == "default suite: suites/cpu.toml — this torch cannot use the GPU"
    assert warning.startswith("warning: this machine has 1 NVIDIA GPU(s)") and "--index-url https://download" in warning
    assert "in suites/cpu.toml); nothing was run" in out


def test_the_attention_transformers_picks_is_recorded_and_shown(tmp_path, write_suite):
    suite = load_suite(write_suite())  # names no attention
    assert {c.model.attn for c in suite.cases} == {"sdpa"}
    run_sweep(suite, SweepOptions(out_dir=str(tmp_path)), annotate=annotate_record)
    for r in load_records(str(tmp_path)).records:
        assert r["measurement"]["attn_implementation"] == r["case"]["model"]["attn"] == "sdpa"
        assert r["measurement"]["attention_kernels"]  # a fused kernel ran, as the estimate assumes
        check = next(c for c in r["checks"] if c["quantity"] == "attn_implementation")
        assert check["verdict"] == "pass" and r["verdict"] == "pass"
        assert r["measurement"]["peak_bytes"] == r["estimate"]["peak_bytes"]  # sdpa's estimate, to the byte
    html = Path(render_report(str(tmp_path), str(tmp_path / "report.html"))).read_text()
    assert "llama-tiny · fp32 · sdpa" in html


def test_a_model_without_sdpa_defaults_to_eager():
    """Asked of transformers in a child interpreter: gemma2's class has no sdpa path."""
    suite = parse_suite('[model]\npreset = "gemma2-2b"\nlayers = 2\n[sweep]\nbatch_size = [1]\nseq_len = [8]\n',
                        "x.toml")
    assert suite.cases[0].model.attn == "eager"
    assert suite.attn_note == "eager: transformers' default for gemma2, whose class has no sdpa path"
