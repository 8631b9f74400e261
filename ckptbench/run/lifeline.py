"""Nothing a sweep starts may outlive it.

A sweep's main process can die without running any cleanup (SIGKILL, a closed terminal, a job manager).
Its helpers then go with it, by the kernel's hand rather than by noticing: the fork server, each worker
(from the moment it is forked) and the torchrun agent ask Linux for SIGKILL when their parent dies
(``PR_SET_PDEATHSIG``, see :func:`arm_fork_server`).  A fork server left waiting on its pipe to the sweep
would exit only after tearing down torch (seconds on a loaded machine), its workers living on meanwhile.
The fork server still exits when that pipe closes on a normal end (workers let go of their copies of
it, see :func:`let_the_fork_server_go`), and a worker also enforces its own timeout, so not even a hung
worker whose parent is gone lives on.

Which sweep may write which shard of a results directory is :mod:`.shards`' business.  Torch-free: the
sweep's parent process imports it.
"""

from __future__ import annotations

import math
import os
import signal

PR_SET_PDEATHSIG = 1
# The sweep's pid, in the environment the fork server starts with: the server arms itself only then
SERVER_PARENT_VAR = "CKPTBENCH_FORK_SERVER_PARENT"


def die_with_parent(parent: int | None = None) -> None:
    """SIGKILL this process when its parent dies (Linux), and now if the parent is already gone.

    `parent` is the pid the parent had when it started this process; without it, the parent seen now
    (which, if the parent died just before, is already init and the death goes unseen).
    """
    if parent is None:
        parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


_forking_from = [0]  # the pid that is forking, set just before each fork (see arm_fork_server)


def arm_fork_server() -> None:
    """In the fork server, as it starts: die with the sweep, and make every worker die with the server.

    Acts only where the environment names the parent the sweep started this server from
    (:data:`SERVER_PARENT_VAR`), so importing it anywhere else does nothing.  The parent-death signal
    follows the thread that started the process: the sweep starts its server from its main thread (see
    ``forkserver.start_fork_server``).  A worker is armed in the fork itself, before it runs a line of
    its own, so a server that dies at any moment takes it along; a process a worker forks is not.
    """
    parent = os.environ.pop(SERVER_PARENT_VAR, "")
    if not parent.isdigit() or int(parent) == os.getpid():
        return
    die_with_parent(int(parent))
    server = os.getpid()

    def before() -> None:
        _forking_from[0] = os.getpid()

    def after_in_child() -> None:
        if _forking_from[0] == server:
            die_with_parent(server)

    os.register_at_fork(before=before, after_in_child=after_in_child)


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
