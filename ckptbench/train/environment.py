"""What only an interpreter with torch and transformers can say about this machine.

The torch half of ``ckptbench env`` and of every record's ``env``: the torch build and whether it has CUDA,
the devices torch sees with their memory, whether pinned host memory can be allocated (transformers'
offload asks for it), and which checkpointing method this transformers has.  A worker calls
:func:`torch_environment` for its record; ``ckptbench env`` and the sweep's choice of a default suite run
``python -m ckptbench.train.environment`` in a child, because the sweep's parent never imports torch.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def checkpointing_api() -> str:
    """The method :func:`.checkpointing.enable_checkpointing` calls with this transformers.

    Read from the installed ``modeling_utils.py`` rather than by importing transformers (seconds): the
    method is defined there or not at all.  A worker's record states the method it really called."""
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("transformers")
    source = pathlib.Path(spec.origin).with_name("modeling_utils.py") if spec and spec.origin else None
    try:
        text = source.read_text(encoding="utf-8") if source else ""
    except OSError:
        text = ""
    prefix = "activation" if "def activation_checkpointing_enable(" in text else "gradient"
    return f"{prefix}_checkpointing_enable"


def torch_environment(touch_cuda: bool) -> dict:
    """torch's view of the machine.  With `touch_cuda` false (a CPU point on a GPU machine) CUDA is not
    initialised: the devices' names and memory and the pinned allocator are then left unprobed (None),
    so the point's memory and start-up are those of a CPU-only process."""
    from .checkpointing import pinned_memory_error

    cuda = torch.cuda.is_available()  # through NVML or the driver's device count: no context is created
    env = {
        "torch_version": torch.__version__,
        "cuda_runtime": torch.version.cuda,  # None: a CPU-only build
        "cuda_available": cuda,
        "cuda_devices": torch.cuda.device_count() if cuda else 0,
        "checkpointing_api": checkpointing_api(),
        "device_name": None,
        "device_memory_bytes": None,
        "cuda_capability": None,  # "major.minor" of device 0: sizes torch's cuBLAS workspaces
        # as the worker inherits it: sets the cuBLAS workspaces' size when given (theory/memory/workspaces.py)
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "devices": [],
        "pinned_memory": None,
    }
    if cuda and not touch_cuda:
        return env
    if cuda:
        props = [torch.cuda.get_device_properties(i) for i in range(env["cuda_devices"])]
        env.update(device_name=props[0].name, device_memory_bytes=props[0].total_memory,
                   cuda_capability=f"{props[0].major}.{props[0].minor}",
                   devices=[f"cuda:{i} {p.name} ({p.total_memory / 2**30:.1f} GiB)" for i, p in enumerate(props)])
    error = pinned_memory_error()
    env["pinned_memory"] = "available" if error is None else f"unavailable: {error}"
    return env


if __name__ == "__main__":
    print(json.dumps(torch_environment(touch_cuda="--no-cuda" not in sys.argv[1:])))
