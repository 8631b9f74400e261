"""One results directory, several sweeps at once: which shard each live sweep holds, and what it runs.

Shards started by hand (``--shard 1/2``, ``--shard 2/2``), the jobs of a Slurm array and a ``--resume``
beside them may all append to one directory (the record store's appends are locked), as long as no
point belongs to two live sweeps.  Each sweep holds an exclusive ``flock`` on ``OUT/.sweep-I-of-N.lock``
for its life; the kernel drops it when the process dies however it dies, so ``--resume`` after a kill
or a requeued job is never refused.  A sweep takes its lock under a short directory lock
(``OUT/.sweeps.lock``) after looking at every other shard's lock: one that is held and shares a point
with its own shard (``1/1`` and ``1/2`` do, ``1/2`` and ``2/2`` do not) refuses it, naming the holder.

Beside its lock a sweep keeps ``OUT/.sweep-I-of-N.json``, replaced atomically as points start and end:
who holds the shard (pid, host, job) and the points in flight with their slots.  ``ckptbench status``
believes it only while the lock is held; left behind by a sweep that died, it names what was running.
The state also names the suite (a digest of its text): shards of one directory are shards of one suite,
so a sweep of another suite is refused while any sweep holds a shard there, whatever the shards.  The
state is written under the directory lock, so a sweep starting a moment later already sees it.
Torch-free: the sweep's parent and ``ckptbench status`` import it.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field

from ..base.errors import UsageError
from ..base.regularfile import open_regular
from ..store.files import write_json_atomic

DIRECTORY_LOCK = ".sweeps.lock"
LOCK_NAME = re.compile(r"^\.sweep-(\d+)-of-(\d+)\.lock$")


def lock_path(out_dir: str, shard: tuple[int, int]) -> str:
    return os.path.join(out_dir, f".sweep-{shard[0]}-of-{shard[1]}.lock")


def state_path(out_dir: str, shard: tuple[int, int]) -> str:
    return os.path.join(out_dir, f".sweep-{shard[0]}-of-{shard[1]}.json")


def overlapping(a: tuple[int, int], b: tuple[int, int], n_cases: int) -> bool:
    """Whether shards `a` and `b` of a suite of `n_cases` points plan a point in common."""
    (i, n), (j, m) = a, b
    return any(k % m == j - 1 for k in range(i - 1, n_cases, n))


class _DirectoryLock:
    """The short lock under which a sweep looks at the other shards and takes its own (None: read-only)."""

    def __init__(self, out_dir: str, exclusive: bool = True):
        self.path = os.path.join(out_dir, DIRECTORY_LOCK)
        self.mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        self.fd: int | None = None

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:  # a read-only copy of a run: nothing can be sweeping into it
            return self
        fcntl.flock(self.fd, self.mode)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _held(path: str) -> bool:
    """Whether a live process holds the lock at `path` (tried, never waited for; under the directory lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO planted there: never wait
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock the probe itself took
    return False


def _holder(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(32).decode(errors="replace").strip() or "?"
    except OSError:
        return "?"


def _shards_in(out_dir: str) -> list[tuple[int, int]]:
    found = []
    for path in glob.glob(os.path.join(glob.escape(out_dir), ".sweep-*-of-*.lock")):
        match = LOCK_NAME.match(os.path.basename(path))
        if match and 1 <= int(match[1]) <= int(match[2]):  # shard 0/0 or 3/2 is no name a sweep gives
            found.append((int(match[1]), int(match[2])))
    return sorted(found, key=lambda s: (s[1], s[0]))


class SweepLock:
    """Held for the life of one sweep of one shard of one results directory."""

    def __init__(self, out_dir: str, shard: tuple[int, int], n_cases: int, job: str | None = None,
                 suite: str | None = None, suite_name: str = ""):
        self.out_dir, self.shard, self.n_cases, self.job = out_dir, shard, n_cases, job
        self.suite, self.suite_name = suite, suite_name  # the suite's digest (None: not compared) and name
        self.path = lock_path(out_dir, shard)
        self.fd: int | None = None
        self.state: dict = {}

    def __enter__(self) -> SweepLock:
        with _DirectoryLock(self.out_dir):
            self._refuse_another_suite()
            for other in _shards_in(self.out_dir):
                if other != self.shard and overlapping(self.shard, other, self.n_cases) \
                        and _held(lock_path(self.out_dir, other)):
                    raise UsageError(f"another sweep (pid {_holder(lock_path(self.out_dir, other))}) is running "
                                     f"shard {other[0]}/{other[1]} into {self.out_dir}, which shares points with "
                                     f"shard {self.shard[0]}/{self.shard[1]}; wait for it or stop it")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(self.path)
                os.close(fd)
                i, n = self.shard
                raise UsageError(f"another sweep (pid {holder}) is running shard {i}/{n} into "
                                 f"{self.out_dir}; wait for it or stop it") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            self.fd = fd
            self.state = {"shard": list(self.shard), "pid": os.getpid(), "host": socket.gethostname(),
                          "job": self.job, "suite": self.suite, "suite_name": self.suite_name,
                          "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "running": []}
            try:
                write_json_atomic(state_path(self.out_dir, self.shard), self.state)
            except BaseException:
                self.__exit__(None)
                raise
        return self

    def _refuse_another_suite(self) -> None:
        """Under the directory lock: no live sweep of the directory may be running another suite."""
        if self.suite is None:
            return
        for other in _shards_in(self.out_dir):
            if other == self.shard or not _held(lock_path(self.out_dir, other)):
                continue
            info = _state(self.out_dir, other)
            if info.get("suite") not in (None, self.suite):
                raise UsageError(f"another sweep (pid {info.get('pid', '?')}) is running shard {other[0]}/{other[1]} "
                                 f"of a different suite ({info.get('suite_name') or '?'}) into {self.out_dir}; "
                                 "shards of one directory must run one suite: write to another --out")

    def running(self, points: list[dict]) -> None:
        """The points in flight now (case id, repeat, slots, since), for ``ckptbench status``."""
        self.state["running"] = points
        write_json_atomic(state_path(self.out_dir, self.shard), self.state)

    def __exit__(self, exc_type, *exc) -> None:
        if self.fd is None:
            return
        if exc_type is None:  # a sweep that ended normally has nothing in flight
            self.state.update(running=[], ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            write_json_atomic(state_path(self.out_dir, self.shard), self.state)
        os.close(self.fd)  # closing drops the lock
        self.fd = None


@dataclass
class ShardState:
    """One shard of a directory as the disk shows it: is a sweep holding it, and what it said last."""

    shard: tuple[int, int]
    held: bool
    info: dict = field(default_factory=dict)  # the state file: pid, host, job, running, started_at, ended_at


def _state(out_dir: str, shard: tuple[int, int]) -> dict:
    """What the sweep of `shard` said last (empty when unreadable)."""
    try:
        with open_regular(state_path(out_dir, shard), "r", encoding="utf-8") as fh:
            info = json.load(fh)
    except (OSError, ValueError, RecursionError):
        info = {}
    if not isinstance(info, dict):
        return {}
    running = info.get("running")
    if running is not None:  # what status lists: points with a case id (a copied or edited file may hold anything)
        info["running"] = [p for p in running if isinstance(p, dict) and isinstance(p.get("case_id"), str)
                           and type(p.get("repeat", 0)) is int] if isinstance(running, list) else []
    return info


def shard_states(out_dir: str) -> list[ShardState]:
    """Every shard that a sweep ever locked in `out_dir`, probed under the directory lock."""
    with _DirectoryLock(out_dir, exclusive=False):
        return [ShardState(shard, _held(lock_path(out_dir, shard)), _state(out_dir, shard))
                for shard in _shards_in(out_dir)]
