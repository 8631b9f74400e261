"""``ckptbench env``: the machine as a sweep sees it, on one screen (or as the JSON every record keeps).

Like ``accelerate env`` or torch's ``collect_env``: versions, the torch build and its CUDA, the devices
with their memory, NVML, pinned memory, the checkpointing method this transformers has, torchrun, and the
suite ``make bench`` would run here.  Everything that could stop a suite is said at once, not point by
point.

Exit status: 0 when this machine can run its default suite as intended; 3 when it cannot: transformers
too old, torch that could not be asked, or an NVIDIA GPU that this torch cannot use (a CPU-only build, a
driver older than the build's CUDA).  ``--gpu`` also counts a machine without any NVIDIA GPU as one
that cannot (what ``scripts/gpu_check.sh`` asks before it starts).
"""

from __future__ import annotations

import json
import sys

from ..run.environment import collect
from ..run.machine import Machine, choose_suite

EXIT_CANNOT_RUN = 3


def problems(env: dict, gpu_required: bool) -> list[str]:
    """What stops this machine's default suite (or, with `gpu_required`, any GPU suite) from running."""
    out = [p for p in (env.get("transformers_problem"), env.get("torch_probe_error")) if p]
    if env.get("gpu_problem") and (env.get("nvml_devices") or gpu_required):
        out.append(f"a GPU suite cannot run here: {env['gpu_problem']}")
    return out


def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "?"


def screen(env: dict) -> list[str]:
    """The one-screen form: a label and a line per fact."""
    if env.get("torch_probe_error"):
        build = f"could not be asked: {env['torch_probe_error']}"
    else:
        build = f"CUDA {env['cuda_runtime']} build" if env.get("cuda_runtime") else "CPU-only build"
    torch = f"{env.get('torch_version')} — {build}"
    devices = env.get("devices") or (["cpu only: torch sees no CUDA device"] if not env.get("cuda_available")
                                     else [f"{env.get('cuda_devices')} CUDA device(s)"])
    nvml = env.get("nvml") or "?"
    if env.get("nvml_devices"):
        nvml += f", CUDA {env.get('driver_cuda') or '?'}; {', '.join(env['nvml_devices'])}"
    elif nvml.startswith("not available"):
        nvml += ": energy and device-level memory are left empty"
    pinned = env.get("pinned_memory") or "not probed"
    if pinned.startswith("unavailable"):
        pinned += " (offload runs with pin_memory=False)"
    choice = choose_suite(Machine.from_environment(env, sys.executable))
    rows = [
        ("ckptbench", f"{env.get('ckptbench_version')} (commit {env.get('git_commit') or '?'}), "
                      f"python {env.get('python')}"),
        ("platform", env.get("platform")),
        ("CPU", f"{env.get('cpu')}, {env.get('cpu_count')} cores"),
        ("torch", torch),
        ("transformers", f"{env.get('transformers_version')} — checkpointing API: {env.get('checkpointing_api', '?')}"
                         + (f"; {env['transformers_problem']}" if env.get("transformers_problem") else "")),
        ("accelerate", env.get("accelerate_version") or "not installed"),
        ("devices", "; ".join(devices)),
        ("NVML", nvml),
        ("pinned memory", pinned),
        ("torchrun", env.get("torchrun") or "not found: points with world_size > 1 cannot run"),
        ("default suite", f"{choice.suite} (what make bench and a sweep without --suite run here)"),
        ("GPU suite", "can run here" if not env.get("gpu_problem") else f"cannot run here: {env['gpu_problem']}"),
    ]
    return [f"{label:<14} {value}" for label, value in rows]


def cmd_env(args) -> int:
    env = collect()
    if args.json:
        print(json.dumps(env, indent=2))
    else:
        print("\n".join(screen(env)))
    found = problems(env, args.gpu)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    return EXIT_CANNOT_RUN if found else 0


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="versions, devices, NVML, pinned memory, checkpointing API: what a sweep "
                                   "here would run on (exit 3 when a suite cannot)")
    p.add_argument("--json", action="store_true", help="the JSON every record keeps as its env")
    p.add_argument("--gpu", action="store_true", help="exit 3 unless a GPU suite can run here")
    p.set_defaults(func=cmd_env)
