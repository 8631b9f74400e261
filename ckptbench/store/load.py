"""Whether a point was timed on a loaded machine, and whether its threads then fought for the cores.

The sweep notes the load average as each point ends (``env.load_average``: 1, 5 and 15 minutes) beside
the machine's cores (``env.cpu_count``), the torch threads the point used (``measurement.threads``) and
the cores it was pinned to (``placement.cores_seen``).  The machine was *loaded* when the one-minute load
average was above its core count: more runnable threads than cores, so a step shared its cores with
others.  A CPU point that ran as many threads as the cores it had while loaded risks OpenMP's collapse:
its threads wait at every parallel region's barrier for the one that was descheduled, and its step
times say more about the neighbours than about the setting.  Such a point never picks a winner.
"""

from __future__ import annotations

import math


def load_1m(text) -> float | None:
    """The one-minute load average of ``env.load_average`` ("1.14 1.64 2.03"), or None."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text) if math.isfinite(text) else None
    try:
        return float(str(text).split()[0])
    except (IndexError, ValueError):
        return None


def _count(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= 0:
        return None
    return int(value)


def load_state(load_average, cpu_count, threads, cores_seen=None, device: str = "cpu") -> dict:
    """``loaded``: the one-minute load average above the machine's cores (None when either is unknown);
    ``oversubscribed``: a loaded CPU point whose threads were at least the cores it had."""
    load, cores = load_1m(load_average), _count(cpu_count)
    loaded = None if load is None or cores is None else load > cores
    own = len(cores_seen) if isinstance(cores_seen, list) and cores_seen else cores
    threads = _count(threads)
    oversubscribed = bool(loaded and device == "cpu" and threads is not None and own is not None and threads >= own)
    return {"load_1m": load, "cores": cores, "loaded": loaded, "threads": threads, "cores_of_point": own,
            "oversubscribed": oversubscribed}


def record_load(record: dict) -> dict:
    """:func:`load_state` of a record: what its env, measurement and placement say."""
    env = record.get("env") or {}
    m = record.get("measurement") or {}
    placement = record.get("placement") or {}
    case = record.get("case") or {}
    return load_state(env.get("load_average"), env.get("cpu_count"), m.get("threads", env.get("torch_threads")),
                      placement.get("cores_seen"), case.get("device", "cpu"))


def warning(record: dict) -> str | None:
    """One line for the sweep's console when a point ran oversubscribed, else None."""
    state = record.get("load") or record_load(record)
    if not state.get("oversubscribed"):
        return None
    return (f"{record.get('strategy', '?')} (case {record.get('case_id', '?')}) ran {state['threads']} threads on "
            f"{state['cores_of_point']} cores while the load average was {state['load_1m']:.2f} on {state['cores']} "
            "cores: its times risk OpenMP's collapse and it is never named fastest")
