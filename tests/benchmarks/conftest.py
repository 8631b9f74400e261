"""Performance benchmarks: collected only under ``--benchmark-only`` (``make perf``).

The unit run (``make test``, plain ``pytest``) has ``--benchmark-skip`` in its addopts, which would still
import these modules (torch, transformers, model builds at collection) only to skip them.  Ignoring the
files unless ``--benchmark-only`` is given keeps ``make test`` exactly as fast as without them.

The machine-info hook adds what decides a time or memory number on this project's machines: the
device, its driver, and the torch / transformers / accelerate versions.  ``ckptbench compare`` reports a
change in them next to the numbers.
"""

from __future__ import annotations


def pytest_ignore_collect(collection_path, config):
    if collection_path.name.startswith("test_") and not config.getoption("benchmark_only", False):
        return True
    return None


def pytest_benchmark_update_machine_info(config, machine_info):
    import torch

    from ckptbench.base.env import cpu_model, package_versions
    from ckptbench.measure.nvml import nvml_inventory
    from ckptbench.run.worker import device_environment

    cuda = torch.cuda.is_available()
    device_env = device_environment("cuda" if cuda else "cpu")
    versions = package_versions()
    machine_info.update(
        device="cuda" if cuda else "cpu",
        device_name=device_env.get("device_name") if cuda else cpu_model(),
        driver=nvml_inventory()["driver"],
        cuda_runtime=device_env.get("cuda_runtime"),
        torch_version=versions.get("torch"),
        transformers_version=versions.get("transformers"),
        accelerate_version=versions.get("accelerate"),
        torch_threads=torch.get_num_threads(),
    )
