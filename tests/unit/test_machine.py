"""The default suite and the GPU verdict for machines described, not the one the tests run on: a CUDA
machine, a GPU box with a CPU-only torch, one whose driver is older than torch's CUDA, a laptop."""

from __future__ import annotations

from ckptbench.cli.environment import problems, screen
from ckptbench.run.machine import (
    CPU_SUITE,
    GPU_SUITE,
    Machine,
    choose_suite,
    cuda_install_command,
    gpu_problem,
)

H200 = ("NVIDIA H200 (139.8 GiB)",)
GPU_BOX = dict(nvidia_gpus=H200, nvml="driver 570.86.15", driver_cuda="12.8", python="/x/.venv/bin/python")


def test_cuda_that_torch_can_use_runs_the_small_gpu_suite():
    m = Machine(**GPU_BOX, torch_version="2.13.0+cu128", torch_cuda="12.8",
                cuda_devices=("cuda:0 NVIDIA H200 (139.8 GiB)",))
    choice = choose_suite(m)
    assert (choice.suite, choice.gpu, choice.problem) == (GPU_SUITE, True, None)
    assert choice.why == f"default suite: {GPU_SUITE} — CUDA: cuda:0 NVIDIA H200 (139.8 GiB), torch 2.13.0+cu128"
    assert gpu_problem(m) is None


def test_a_machine_without_an_nvidia_gpu_runs_the_cpu_suite_and_says_why():
    m = Machine(nvml="not available (NVMLError_LibraryNotFound: no driver)", torch_version="2.13.0+cpu")
    choice = choose_suite(m)
    assert (choice.suite, choice.gpu, choice.problem) == (CPU_SUITE, False, None)  # nothing to fix on a laptop
    assert choice.why == (f"default suite: {CPU_SUITE} — no NVIDIA GPU found; NVML: not available "
                          "(NVMLError_LibraryNotFound: no driver); torch 2.13.0+cpu is a CPU-only build")


def test_a_gpu_box_with_a_cpu_only_torch_is_told_how_to_install_the_cuda_build():
    m = Machine(**GPU_BOX, torch_version="2.13.0+cpu", torch_cuda=None)
    choice = choose_suite(m)
    assert (choice.suite, choice.gpu) == (CPU_SUITE, False)
    command = ("/x/.venv/bin/python -m pip install 'torch==2.13.0+cu128' "
               "--index-url https://download.pytorch.org/whl/cu128")  # the newest CUDA this driver takes
    assert choice.problem == ("this machine has 1 NVIDIA GPU(s) (NVIDIA H200 (139.8 GiB); driver 570.86.15, CUDA "
                              f"12.8), but torch 2.13.0+cpu is a CPU-only build; install the CUDA build: {command}")


def test_the_cuda_index_follows_the_driver():
    def index(driver_cuda):
        return cuda_install_command(Machine(driver_cuda=driver_cuda, torch_version="2.13.0")).split("/")[-1]

    assert [index(v) for v in ("13.1", "13.0", "12.9", "12.8", "12.6", "12.2", None)] == \
        ["cu130", "cu130", "cu128", "cu128", "cu126", "cu126", "cu130"]


def test_a_cuda_build_newer_than_the_driver_says_so():
    m = Machine(**{**GPU_BOX, "driver_cuda": "12.6"}, torch_version="2.13.0+cu130", torch_cuda="13.0")
    problem = choose_suite(m).problem
    assert problem.startswith("torch 2.13.0+cu130 is built for CUDA 13.0 but sees no device")
    assert "the driver supports CUDA 12.6 only" in problem and "'torch==2.13.0+cu126'" in problem
    same = Machine(**GPU_BOX, torch_version="2.13.0+cu128", torch_cuda="12.8")
    assert gpu_problem(same).endswith("check CUDA_VISIBLE_DEVICES and the driver")


def test_torch_that_cannot_be_asked_is_the_problem_named():
    m = Machine(probe_error="ModuleNotFoundError: No module named 'torch'")
    choice = choose_suite(m)
    assert choice.suite == CPU_SUITE
    assert choice.problem == "torch could not be asked what it sees: ModuleNotFoundError: No module named 'torch'"


def test_machine_from_the_environment_json():
    env = {"nvml_devices": list(H200), "nvml": "driver 570.86.15", "driver_cuda": "12.8",
           "torch_version": "2.13.0+cu128", "cuda_runtime": "12.8", "cuda_available": True, "cuda_devices": 1,
           "devices": ["cuda:0 NVIDIA H200 (139.8 GiB)"]}
    assert Machine.from_environment(env, "py") == Machine(**{**GPU_BOX, "python": "py"}, torch_version="2.13.0+cu128",
                                                          torch_cuda="12.8", cuda_devices=tuple(env["devices"]))
    # a worker of a CPU point leaves CUDA alone: torch says it has a device, not which
    assert Machine.from_environment({**env, "devices": []}).cuda_devices == ("1 CUDA device(s)",)


def test_env_exit_rule():
    laptop = {"gpu_problem": "no NVIDIA GPU found; NVML: not available", "nvml_devices": []}
    assert problems(laptop, gpu_required=False) == []  # a CPU machine runs its default suite: fine
    assert problems(laptop, gpu_required=True) == ["a GPU suite cannot run here: no NVIDIA GPU found; NVML: not available"]
    gpu_box = {"gpu_problem": "torch 2.13.0+cpu is a CPU-only build", "nvml_devices": list(H200)}
    assert problems(gpu_box, gpu_required=False) == ["a GPU suite cannot run here: torch 2.13.0+cpu is a CPU-only build"]
    assert problems({"transformers_problem": "transformers 5.16.0 is older than 5.17", "gpu_problem": None},
                    gpu_required=True) == ["transformers 5.16.0 is older than 5.17"]
    assert problems({"gpu_problem": None, "nvml_devices": list(H200)}, gpu_required=True) == []


def test_env_screen_of_a_cuda_machine():
    env = {"ckptbench_version": "0.1.0", "git_commit": "abc", "python": "3.12.3", "platform": "Linux", "cpu": "Xeon",
           "cpu_count": 16, "torch_version": "2.13.0+cu128", "cuda_runtime": "12.8", "cuda_available": True,
           "cuda_devices": 1, "devices": ["cuda:0 NVIDIA H200 (139.8 GiB)"], "nvml": "driver 570.86.15",
           "driver_cuda": "12.8", "nvml_devices": list(H200), "pinned_memory": "available",
           "checkpointing_api": "activation_checkpointing_enable", "transformers_version": "5.23.0",
           "accelerate_version": "1.15.0", "torchrun": "/usr/bin/torchrun", "gpu_problem": None}
    lines = dict((line[:14].strip(), line[15:]) for line in screen(env))
    assert lines["torch"] == "2.13.0+cu128 — CUDA 12.8 build"
    assert lines["devices"] == "cuda:0 NVIDIA H200 (139.8 GiB)"
    assert lines["NVML"] == "driver 570.86.15, CUDA 12.8; NVIDIA H200 (139.8 GiB)"
    assert lines["default suite"].startswith(GPU_SUITE) and lines["GPU suite"] == "can run here"
    assert problems(env, gpu_required=True) == []
