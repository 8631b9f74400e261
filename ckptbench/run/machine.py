"""Which suite this machine should run by default, and why a GPU suite could not run here.

Pure decisions over what :mod:`.environment` collected, so they are tested by handing them a
:class:`Machine` (a CUDA machine, a GPU box with a CPU-only torch, a laptop) instead of the machine the
tests happen to run on.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_SUITE = "suites/gpu-small.toml"
CPU_SUITE = "suites/cpu.toml"
# CUDA builds of torch on download.pytorch.org, newest first: (the CUDA version a driver must support, index)
CUDA_INDEXES = (((13, 0), "cu130"), ((12, 8), "cu128"), ((12, 6), "cu126"))


@dataclass(frozen=True)
class Machine:
    """What decides the default suite: the NVIDIA GPUs the driver shows, and what this torch makes of them."""

    nvidia_gpus: tuple[str, ...] = ()  # NVML's devices, "name (N GiB)"; empty without a driver
    nvml: str = ""  # "driver X", or "not available: why"
    driver_cuda: str | None = None  # the newest CUDA the driver supports, "12.8"
    torch_version: str | None = None
    torch_cuda: str | None = None  # torch.version.cuda; None for a CPU-only build
    cuda_devices: tuple[str, ...] = ()  # the devices torch sees
    probe_error: str = ""  # torch could not be asked (then the torch fields are unknown)
    python: str = "python"  # the interpreter a fix must install into

    @property
    def cuda_available(self) -> bool:
        return bool(self.cuda_devices)

    @classmethod
    def from_environment(cls, env: dict, python: str = "python") -> Machine:
        cuda = (env.get("devices") or [f"{env.get('cuda_devices')} CUDA device(s)"]) if env.get("cuda_available") else []
        return cls(nvidia_gpus=tuple(env.get("nvml_devices") or ()), nvml=env.get("nvml") or "",
                   driver_cuda=env.get("driver_cuda"), torch_version=env.get("torch_version"),
                   torch_cuda=env.get("cuda_runtime"), cuda_devices=tuple(cuda),
                   probe_error=env.get("torch_probe_error") or "", python=python)


@dataclass(frozen=True)
class SuiteChoice:
    """The default suite, the line that says why (printed before anything runs), and on a GPU machine
    that cannot use its GPU, what is wrong and how to fix it."""

    suite: str  # relative to the repository root
    gpu: bool
    why: str
    problem: str | None = None


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (text or "").split(".")[:2])
    except ValueError:
        return ()


def cuda_install_command(m: Machine) -> str:
    """The pip command that replaces this torch by the same release built for CUDA, for a CUDA version
    the machine's driver supports (the newest index when the driver's is unknown)."""
    driver = _version(m.driver_cuda)
    tag = next((tag for need, tag in CUDA_INDEXES if not driver or driver >= need), CUDA_INDEXES[-1][1])
    release = (m.torch_version or "").split("+")[0]
    pin = f"'torch=={release}+{tag}'" if release else "torch"
    return f"{m.python} -m pip install {pin} --index-url https://download.pytorch.org/whl/{tag}"


def gpu_problem(m: Machine) -> str | None:
    """Why a GPU suite could not run on this machine, with the fix where there is one; None when it can."""
    if m.cuda_available:
        return None
    if m.probe_error:
        return f"torch could not be asked what it sees: {m.probe_error}"
    if not m.nvidia_gpus:
        build = "" if m.torch_cuda else f"; torch {m.torch_version} is a CPU-only build"
        return f"no NVIDIA GPU found; NVML: {m.nvml}{build}"
    gpus = f"{len(m.nvidia_gpus)} NVIDIA GPU(s) ({', '.join(m.nvidia_gpus)}; {m.nvml}, CUDA {m.driver_cuda or '?'})"
    if m.torch_cuda is None:
        return (f"this machine has {gpus}, but torch {m.torch_version} is a CPU-only build; install the CUDA build: "
                f"{cuda_install_command(m)}")
    old_driver = _version(m.driver_cuda) and _version(m.driver_cuda) < _version(m.torch_cuda)
    fix = (f"; the driver supports CUDA {m.driver_cuda} only: update the driver, or install a build for it: "
           f"{cuda_install_command(m)}" if old_driver else "; check CUDA_VISIBLE_DEVICES and the driver")
    return f"torch {m.torch_version} is built for CUDA {m.torch_cuda} but sees no device on this machine's {gpus}{fix}"


def choose_suite(m: Machine) -> SuiteChoice:
    """CUDA that torch can use: the small GPU suite; otherwise the CPU suite, saying why, and on a machine
    with an NVIDIA GPU that torch cannot use, what to fix."""
    if m.cuda_available:
        return SuiteChoice(GPU_SUITE, True, f"default suite: {GPU_SUITE} — CUDA: {', '.join(m.cuda_devices)}, "
                                            f"torch {m.torch_version}")
    problem = gpu_problem(m)
    if m.nvidia_gpus or m.probe_error:
        return SuiteChoice(CPU_SUITE, False, f"default suite: {CPU_SUITE} — this torch cannot use the GPU", problem)
    return SuiteChoice(CPU_SUITE, False, f"default suite: {CPU_SUITE} — {problem}")
