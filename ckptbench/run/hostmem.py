"""How much memory this machine (and its container) can still give, and how much a worker holds.

A worker killed by SIGKILL leaves no message: the kernel's OOM killer, a job manager and a user's
``kill -9`` look the same from outside.  So ``oom`` names only what a mechanism stopped: the kernel's
own count of OOM kills in the memory cgroup, the machine out of memory at the sweep's last look before
the death (:func:`explain_kill`), the sweep's stop of a worker past ``--memory-gib`` (:class:`WorkerWatch`),
or an allocation refused by the limit a CPU worker sets on its private memory (:func:`limit_private_memory`),
which the worker records itself.  The same readings size a point before it starts: a point whose
estimated peak exceeds what is available is not started (see :mod:`.fits`).

Everything here reads ``/proc`` and the cgroup files (v2 or v1), never imports torch, and answers None
where a file is missing (another OS, a sandbox): an unknown figure never becomes a verdict.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# A SIGKILLed worker is called out of memory when, at the last look before it died, the machine had less
# than this fraction of its memory available (the last look: an early dip says nothing of a later death).
LOW_AVAILABLE_FRACTION = 0.05
UNLIMITED = 2**62  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _kib_fields(text: str | None, names: tuple[str, ...]) -> dict[str, int]:
    """``Name:   123 kB`` lines (meminfo, /proc/PID/status) as bytes."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024
    return out


def _cgroup_dirs(pid: str = "self") -> tuple[str | None, str | None]:
    """(v2 directory, v1 memory directory) of `pid`'s cgroup, where they can be found."""
    v2 = v1 = None
    for line in (_read(f"/proc/{pid}/cgroup") or "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and not controllers:
            v2 = "/sys/fs/cgroup" + path.rstrip("/")
        elif "memory" in controllers.split(","):
            v1 = "/sys/fs/cgroup/memory" + path.rstrip("/")
    # inside a container the cgroup path is often the namespace root: fall back to the mount's top
    if v2 and not os.path.exists(os.path.join(v2, "memory.current")):
        v2 = "/sys/fs/cgroup" if os.path.exists("/sys/fs/cgroup/memory.current") else None
    if v1 and not os.path.exists(os.path.join(v1, "memory.usage_in_bytes")):
        v1 = "/sys/fs/cgroup/memory" if os.path.exists("/sys/fs/cgroup/memory/memory.usage_in_bytes") else None
    return v2, v1


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _counter(text: str | None, name: str) -> int | None:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return _int(value)
    return None


@dataclass(frozen=True)
class HostMemory:
    """One reading of the machine's memory and of the memory cgroup the sweep runs in."""

    total: int | None = None  # MemTotal
    available: int | None = None  # MemAvailable: what can be allocated without swapping
    cgroup_limit: int | None = None  # memory.max / memory.limit_in_bytes, None when unlimited
    cgroup_usage: int | None = None
    oom_kills: int | None = None  # the cgroup's count of OOM-killer kills, where the kernel keeps one

    @property
    def usable(self) -> int | None:
        """What a new allocation can still get: the machine's available memory, or the container's
        remaining allowance when that is smaller."""
        figures = [self.available]
        if self.cgroup_limit is not None and self.cgroup_usage is not None:
            figures.append(max(0, self.cgroup_limit - self.cgroup_usage))
        known = [f for f in figures if f is not None]
        return min(known) if known else None

    @property
    def capacity(self) -> int | None:
        """The most the machine or container could hold at all."""
        known = [f for f in (self.total, self.cgroup_limit) if f is not None]
        return min(known) if known else None


def read_host_memory() -> HostMemory:
    info = _kib_fields(_read("/proc/meminfo"), ("MemTotal", "MemAvailable"))
    limit = usage = kills = None
    v2, v1 = _cgroup_dirs()
    if v2:
        limit = _int(_read(os.path.join(v2, "memory.max")))  # "max" (no limit) reads as None
        usage = _int(_read(os.path.join(v2, "memory.current")))
        kills = _counter(_read(os.path.join(v2, "memory.events")), "oom_kill")
    elif v1:
        limit = _int(_read(os.path.join(v1, "memory.limit_in_bytes")))
        usage = _int(_read(os.path.join(v1, "memory.usage_in_bytes")))
        kills = _counter(_read(os.path.join(v1, "memory.oom_control")), "oom_kill")
    if limit is not None and limit >= UNLIMITED:
        limit = None
    return HostMemory(info.get("MemTotal"), info.get("MemAvailable"), limit, usage, kills)


def resident_bytes(pid: int) -> tuple[int, int] | None:
    """(resident now, highest resident so far) of process `pid`: VmRSS and VmHWM, or None once it is gone."""
    fields = _kib_fields(_read(f"/proc/{pid}/status"), ("VmRSS", "VmHWM"))
    if "VmRSS" not in fields:
        return None
    return fields["VmRSS"], fields.get("VmHWM", fields["VmRSS"])


def human_bytes(nbytes: float) -> str:
    """A memory figure for a reason line: GiB, or MiB below one GiB (a tiny point's peak is still legible)."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


@dataclass
class WorkerWatch:
    """Samples a running worker's resident memory and the machine's, so its death can be explained.

    The sweep calls :meth:`sample` every few tenths of a second while it waits for the worker.  VmHWM is
    the kernel's own high-water mark, so the worker's peak is exact up to the last sample even when it
    rose and fell between two.
    """

    pid: int
    cap: int | None = None  # --memory: the most a worker may hold; the sweep stops one that holds more
    before: HostMemory = field(default_factory=read_host_memory)
    peak_rss: int = 0
    last_rss: int = 0
    last_host: HostMemory | None = None  # the machine at the last look while the worker was alive
    samples: int = 0

    def sample(self) -> None:
        own = resident_bytes(self.pid)
        if own is None:
            return
        self.last_rss, hwm = own
        self.peak_rss = max(self.peak_rss, hwm)
        host = read_host_memory()
        if host.usable is not None:
            self.last_host = host
        self.samples += 1

    def over_cap(self) -> bool:
        return self.cap is not None and self.peak_rss > self.cap

    def figures(self) -> dict:
        last = self.last_host
        return {"worker_peak_rss_bytes": self.peak_rss or None, "memory_cap_bytes": self.cap,
                "last_available_bytes": last.usable if last else None,
                "machine_bytes": last.capacity if last else self.before.capacity, "samples": self.samples}


def explain_kill(watch: WorkerWatch, after: HostMemory) -> str | None:
    """Why a worker that died of SIGKILL was out of memory, or None when nothing says it was.

    Either of two signs: the cgroup's OOM-kill counter rose while the worker ran; the machine (or
    container) had under :data:`LOW_AVAILABLE_FRACTION` of its memory left at the last look before the
    death.  How close the worker came to ``--memory-gib`` is no sign: nothing kills at that cap but the
    sweep itself, which says so (see :meth:`WorkerWatch.over_cap`).
    """
    f = watch.figures()
    held = f"the worker held {human_bytes(watch.peak_rss)} at its peak" if watch.peak_rss else "the worker's size is unknown"
    if watch.before.oom_kills is not None and after.oom_kills is not None and after.oom_kills > watch.before.oom_kills:
        return (f"killed by the kernel's OOM killer (the memory cgroup's oom_kill count rose from "
                f"{watch.before.oom_kills} to {after.oom_kills}); {held}")
    last, machine = f["last_available_bytes"], f["machine_bytes"]
    if last is not None and machine and last < LOW_AVAILABLE_FRACTION * machine:
        return (f"killed by SIGKILL while memory ran out: {held}, and only {human_bytes(last)} of the machine's "
                f"{human_bytes(machine)} was available at the last look")
    return None


def limit_private_memory(cap: int) -> bool:
    """In a worker: make an allocation that would take this process's private memory past `cap` fail.

    ``RLIMIT_DATA`` (Linux ≥ 4.7 counts every private writable mapping, so torch's CPU allocator is
    refused with ``can't allocate memory``, Python with ``MemoryError``), which the worker records as
    ``oom``.  Shared memory escapes it, so the sweep still stops a worker whose resident memory passes
    the cap.  Not set (False) when the process already holds more than `cap`: it could not even write
    its result, and the sweep stops it.
    """
    import resource

    data = _kib_fields(_read("/proc/self/status"), ("VmData",)).get("VmData")
    if data is None or data >= cap:
        return False
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    return True
