"""The Environment section: the machine and software a run saw, as labelled rows a person reads.

Records keep the environment as the keys the sweep gathered (``cpu_count``, ``torch_version``,
``nvml_devices`` as a list) plus the load average as each point ended.  This turns them into rows
labelled "CPU", "torch", "Threads", … with lists joined and units written out; keys it does not know are
shown under their own name.  A value that differs between points lists each value with how many points
had it.  The load averages, one triple per point, are summarised (the 1-minute load's min, median and
max against the core count, and how many points ended with more load than cores); every point's triple
is listed in a table the page keeps folded.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from .columns import _missing

LOAD_KEY = "load_average"
LOAD_ROWS = 2000  # past this many points the folded per-point table lists the first ones only
THREAD_VARS = "OMP/MKL/OpenBLAS thread variables"


@dataclass
class LoadSummary:
    """The load average over a run's points: the summary line and the per-point rows."""

    summary: str
    points: list[dict] = field(default_factory=list)  # finished, setting, one, five, fifteen, busy
    total: int = 0
    above: int = 0


@dataclass
class EnvTable:
    rows: list[tuple[str, str]] = field(default_factory=list)
    load: LoadSummary | None = None


def _gib(value) -> str:
    return f"{float(value) / 2**30:.1f} GiB"


def _join(value) -> str:
    """Lists joined with commas (``none`` when empty), booleans as yes/no, anything else as text."""
    if isinstance(value, (list, tuple)):
        return ", ".join(_join(v) for v in value) if value else "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_join(v)}" for k, v in value.items()) or "none"
    return str(value)


def _plural(n, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _ckptbench(v: dict) -> str | None:
    version, commit = v.get("ckptbench_version"), v.get("git_commit")
    parts = [str(version)] if version else []
    if commit:
        parts.append(f"commit {commit}" + (" (uncommitted changes)" if str(commit).endswith("-dirty") else ""))
    return ", ".join(parts) or None


def _torch(v: dict, has: set[str]) -> str | None:
    version = v.get("torch_version") or v.get("torch")
    if not version:
        return None
    cuda = v.get("cuda_runtime")
    if cuda:
        return f"{version} (CUDA {cuda} build)"
    return f"{version} (CPU-only build)" if "cuda_runtime" in has else str(version)


def _package(key: str):
    return lambda v: "not installed" if v.get(key) is None else str(v[key])


def _cpu(v: dict) -> str | None:
    name, cores = v.get("cpu"), v.get("cpu_count")
    if cores is None:
        return name
    cores = _plural(int(cores), "logical core")
    return f"{name}, {cores}" if name else cores


def _threads(v: dict) -> str | None:
    threads, env = v.get("torch_threads"), v.get("thread_env")
    parts = [f"{_plural(int(threads), 'torch thread')} per process"] if threads is not None else []
    if env:
        parts.append(f"{THREAD_VARS} unset" if env == "unset" else str(env))
    return "; ".join(parts) or None


def _cuda(v: dict, has: set[str]) -> str | None:
    if "cuda_available" not in has or v.get("cuda_available") is None:
        return None
    if not v["cuda_available"]:
        return "not available"
    n = v.get("cuda_devices")
    return "available" + (f", {_plural(int(n), 'device')}" if n else "")


def _gpus(v: dict) -> str | None:
    devices = v.get("devices")
    if isinstance(devices, (list, tuple)) and devices:
        return ", ".join(map(str, devices))
    name, mem = v.get("device_name"), v.get("device_memory_bytes")
    if not name:
        return None
    return f"{name} ({_gib(mem)})" if mem else str(name)


def _nvml(v: dict) -> str | None:
    nvml = v.get("nvml")
    if not nvml and not v.get("driver"):
        return None
    text = str(nvml or f"driver {v['driver']}")
    if v.get("driver_cuda"):
        text += f", supports CUDA {v['driver_cuda']}"
    devices = v.get("nvml_devices")
    if isinstance(devices, (list, tuple)) and devices:
        text += "; " + ", ".join(map(str, devices))
    return text


def _gpu_suite(v: dict, has: set[str]) -> str | None:
    if "gpu_problem" not in has:
        return None
    problem = v.get("gpu_problem")
    return "can run here" if not problem else f"cannot run here: {problem}"


def _key(key: str):
    return lambda v: None if v.get(key) is None else _join(v[key])


# (label, keys read, value of one point from its env dict, or with `has` (the env keys the run records)).
ROWS = (
    ("ckptbench", ("ckptbench_version", "git_commit"), _ckptbench),
    ("Python", ("python",), _key("python")),
    ("torch", ("torch_version", "torch", "cuda_runtime"), _torch),
    ("transformers", ("transformers_version",), _package("transformers_version")),
    ("accelerate", ("accelerate_version",), _package("accelerate_version")),
    ("numpy", ("numpy_version",), _package("numpy_version")),
    ("nvidia-ml-py", ("nvidia-ml-py_version",), _package("nvidia-ml-py_version")),
    ("transformers problem", ("transformers_problem",), _key("transformers_problem")),
    ("Checkpointing API", ("checkpointing_api",), _key("checkpointing_api")),
    ("Platform", ("platform",), _key("platform")),
    ("Host", ("hostname",), _key("hostname")),
    ("CPU", ("cpu", "cpu_count"), _cpu),
    ("Threads", ("torch_threads", "thread_env"), _threads),
    ("CUDA", ("cuda_available", "cuda_devices"), _cuda),
    ("GPUs", ("devices", "device_name", "device_memory_bytes"), _gpus),
    ("NVML", ("nvml", "driver", "driver_cuda", "nvml_devices"), _nvml),
    ("Pinned host memory", ("pinned_memory",), _key("pinned_memory")),
    ("torchrun", ("torchrun",), _key("torchrun")),
    ("GPU suite", ("gpu_problem",), _gpu_suite),
)
TAKES_HAS = {_torch, _cuda, _gpu_suite}


def _label(key: str) -> str:
    """A key no row knows, under its own name (``foo_version`` as ``foo``)."""
    return key[: -len("_version")] if key.endswith("_version") else key.replace("_", " ")


def _distinct(texts: Counter) -> str | None:
    """One value when every point agrees; else each value with its count of points, most common first."""
    texts.pop(None, None)
    if not texts:
        return None
    if len(texts) == 1:
        return next(iter(texts))
    return "; ".join(f"{text} ({_plural(n, 'point')})" for text, n in texts.most_common())


def _freeze(value):
    """A value as a hashable one: lists as tuples, missing as None (so equal environments count as one)."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return value
    if kind is float:
        return None if value != value else value
    if kind is list or kind is tuple:
        return tuple(_freeze(v) for v in value)
    return None if _missing(value) else str(value)


def _environments(frame: pd.DataFrame) -> tuple[list[tuple[dict, int]], set[str]]:
    """Each distinct environment of the records (known values only) with how many records had it, and
    the keys seen.  A run's points nearly all share one: formatting each once keeps 20,000 records cheap."""
    keys = [c[4:] for c in frame.columns if c.startswith("env.") and c != f"env.{LOAD_KEY}"]
    columns = [[v if type(v) is str else _freeze(v) for v in frame[f"env.{k}"]] for k in keys]
    combos = Counter(zip(*columns)) if keys else Counter()
    envs = [({k: v for k, v in zip(keys, combo) if v is not None}, n) for combo, n in combos.items()]
    return envs, {c[4:] for c in frame.columns if c.startswith("env.")}


def environment_table(frame: pd.DataFrame, settings: list[str] | None = None) -> EnvTable:
    """The Environment section of the records frame (:func:`~.columns.record_frame`); `settings` names
    each record's point for the per-point load table (same order as the frame)."""
    out = EnvTable()
    if frame is None or not len(frame):
        return out
    envs, has = _environments(frame)
    used = {LOAD_KEY}
    for label, keys, fn in ROWS:
        used.update(keys)
        if not has & set(keys):
            continue
        texts = Counter()
        for d, n in envs:
            texts[fn(d, has) if fn in TAKES_HAS else fn(d)] += n
        value = _distinct(texts)
        if value is not None:
            out.rows.append((label, value))
    for key in sorted(has - used):
        texts = Counter()
        for d, n in envs:
            texts[None if d.get(key) is None else _join(d[key])] += n
        value = _distinct(texts)
        if value is not None:
            out.rows.append((_label(key), value))
    if LOAD_KEY in has:
        cores = Counter({int(d["cpu_count"]): n for d, n in envs if isinstance(d.get("cpu_count"), (int, float))})
        finished = list(frame["finished_at"]) if "finished_at" in frame.columns else [None] * len(frame)
        out.load = load_summary(list(frame[f"env.{LOAD_KEY}"]), finished, settings,
                                cores.most_common(1)[0][0] if cores else None)
        if out.load is not None:
            out.rows.append(("Load average", out.load.summary))
    return out


def _triple(value) -> tuple[float, ...] | None:
    """A point's load average, "1.02 1.02 0.91" (or a list), as three floats; None when unreadable."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    parts = value if isinstance(value, (list, tuple)) else str(value).split()
    try:
        nums = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        return None
    return nums if len(nums) == 3 and all(math.isfinite(x) for x in nums) else None


def load_summary(loads: list, finished: list, settings: list[str] | None = None,
                 cores: int | None = None) -> LoadSummary | None:
    """The 1-minute load over the run's points against `cores`, and every point's triple (the first
    :data:`LOAD_ROWS` by finish time)."""
    names = settings if settings is not None else [""] * len(loads)
    seen: dict = {}
    points = []
    for load, when, name in zip(loads, finished, names):
        key = tuple(load) if isinstance(load, list) else load
        triple = seen[key] if key in seen else seen.setdefault(key, _triple(load))
        if triple is not None:
            points.append(("" if _missing(when) else str(when), name, triple))
    if not points:
        return None
    points.sort(key=lambda p: p[0])
    ones = [p[2][0] for p in points]
    text = (f"1-minute load as each point ended, over {_plural(len(points), 'point')}: "
            f"min {min(ones):.2f}, median {statistics.median(ones):.2f}, max {max(ones):.2f}")
    above = sum(one > cores for one in ones) if cores is not None else 0
    if cores is not None:
        text += (f", against {_plural(cores, 'logical core')}; {_plural(above, 'point')} ended with "
                 f"more load than cores")
    rows = [{"finished": when, "setting": name, "one": one, "five": five, "fifteen": fifteen,
             "busy": cores is not None and one > cores} for when, name, (one, five, fifteen) in points[:LOAD_ROWS]]
    return LoadSummary(summary=text, points=rows, total=len(points), above=above)
