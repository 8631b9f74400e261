"""The environment a run happened in, gathered without importing torch (the parent never does)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

PACKAGES = ("ckptbench", "torch", "transformers", "accelerate", "numpy", "nvidia-ml-py")
# The oldest transformers whose checkpointing API ckptbench calls: gradient_checkpointing_enable(
# every_n_layers=, offload=) arrived in 5.16 (every_n_layers) and 5.17 (offload).
MIN_TRANSFORMERS = "5.17"


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def unsupported_transformers(installed: str | None = None) -> str | None:
    """Why the installed transformers cannot run a sweep, in one line, or None when it can."""
    from packaging.version import Version

    installed = installed or package_versions()["transformers"]
    if installed is None:
        return f"transformers is not installed; pip install 'transformers>={MIN_TRANSFORMERS}'"
    if Version(installed) < Version(MIN_TRANSFORMERS):
        return (f"transformers {installed} is older than {MIN_TRANSFORMERS}, the first release whose "
                f"gradient_checkpointing_enable takes every_n_layers and offload; "
                f"pip install 'transformers>={MIN_TRANSFORMERS}'")
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    # "-dirty" means the code that ran differs from the commit: results and reports do not count
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/ckptbench", ":/suites",
                            ":/scripts", ":/pyproject.toml", ":/constraints.txt"], cwd=cwd,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def torchrun_path() -> str | None:
    """torchrun next to this interpreter (a virtual environment's), else on PATH: what multi-rank points run."""
    here = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return here if os.access(here, os.X_OK) else shutil.which("torchrun")


def host_environment() -> dict:
    """Versions, CPU, commit, torchrun, and whether this transformers can run a sweep: what needs no torch,
    the same for every record of one sweep, so gathered once."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
        "git_commit": git_commit(os.path.dirname(os.path.abspath(__file__))),
        **{f"{k}_version": v for k, v in package_versions().items()},
        "torchrun": torchrun_path(),
        "transformers_problem": unsupported_transformers(),
    }
