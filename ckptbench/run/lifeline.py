"""Nothing a sweep starts may outlive it, and one sweep at a time writes a shard of a results directory.

A sweep's main process can die without running any cleanup (SIGKILL, a closed terminal, a job manager).
Its helpers then go with it: the fork server exits when its pipe to the sweep closes (workers let go of
their copies of it, see :func:`let_the_fork_server_go`), each worker and
the torchrun agent ask Linux for SIGKILL when their parent dies (``PR_SET_PDEATHSIG``), and a worker also
enforces its own timeout, so not even a hung worker whose parent is gone lives on.

:class:`SweepLock` is an exclusive ``flock`` on ``OUT/.sweep-I-of-N.lock`` held for the sweep's life; the
kernel drops it when the process dies however it dies, so ``--resume`` right after a kill is never
refused, while a second sweep of the same shard running at the same time is, with the first one's pid.
Torch-free: the sweep's parent process imports it.
"""

from __future__ import annotations

import fcntl
import math
import os
import signal

from ..errors import UsageError

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux), and now if the parent is already gone."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def let_the_fork_server_go() -> None:
    """Close a forked worker's copy of the fork server's "alive" pipe.

    multiprocessing hands every worker the pipe's write end, and the fork server exits only when no
    process holds it.  A hung worker would keep the server alive after the sweep died, and the server
    being alive keeps the worker's parent-death signal from firing: closed, the sweep's death reaches
    the server at once, and the server's death reaches the worker.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        os.close(fd)
        server._forkserver_alive_fd = None


def self_timeout(timeout_s: float | None, grace_s: float = 5.0) -> None:
    """End this process by SIGALRM a little after `timeout_s` (the parent kills it first while alive)."""
    if timeout_s:
        signal.alarm(math.ceil(timeout_s + grace_s))


class SweepLock:
    """Held for the life of one sweep of one shard of one results directory."""

    def __init__(self, out_dir: str, shard: tuple[int, int]):
        self.path = os.path.join(out_dir, f".sweep-{shard[0]}-of-{shard[1]}.lock")
        self.shard = shard
        self.fd: int | None = None

    def __enter__(self) -> SweepLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            i, n = self.shard
            raise UsageError(f"another sweep (pid {holder}) is running shard {i}/{n} into "
                             f"{os.path.dirname(self.path)}; wait for it or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the lock
            self.fd = None


if __name__ == "__main__":  # python -m ckptbench.run.lifeline PROGRAM ARGS...: run PROGRAM, dying with our parent
    import sys

    die_with_parent()
    os.execv(sys.argv[1], sys.argv[1:])
