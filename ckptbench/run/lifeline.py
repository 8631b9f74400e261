"""Nothing a sweep starts may outlive it.

A sweep's main process can die without running any cleanup (SIGKILL, a closed terminal, a job manager).
Its helpers then go with it: the fork server exits when its pipe to the sweep closes (workers let go of
their copies of it, see :func:`let_the_fork_server_go`), each worker and
the torchrun agent ask Linux for SIGKILL when their parent dies (``PR_SET_PDEATHSIG``), and a worker also
enforces its own timeout, so not even a hung worker whose parent is gone lives on.

Which sweep may write which shard of a results directory is :mod:`.shards`' business.  Torch-free: the
sweep's parent process imports it.
"""

from __future__ import annotations

import math
import os
import signal

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


# Cores a launched program (a torchrun group) is pinned to, as "0,1": set by the sweep for a slot's cores,
# read here rather than through Popen's preexec_fn, which is unsafe in the sweep's threaded parent.
CORES_VAR = "CKPTBENCH_CORES"


if __name__ == "__main__":  # python -m ckptbench.run.lifeline PROGRAM ARGS...: run PROGRAM, dying with our parent
    import sys

    die_with_parent()
    cores = os.environ.pop(CORES_VAR, "")
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})  # torchrun and every rank inherit it
    os.execv(sys.argv[1], sys.argv[1:])
