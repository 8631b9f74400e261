"""The step's every heap allocation, logged and replayed: the page faults glibc's heap trimming costs a CPU step.

glibc gives the top of its heap back to the kernel whenever a free leaves more than its trim threshold
there (twice the mmap threshold, which a freed mmapped block raises to its own size: a few MiB for these
steps' tensors), and every page the heap then grows into again is a minor fault.  Whether a free reaches
the top depends on every block below it, and the tensors torch's allocator reports are a tenth of the
step's allocations: autograd's nodes, the interpreter's larger objects and the kernels' scratch are the
rest.  Replayed alone the tensors take no fault on steps that take thousands (gpt2-tiny full 16 × 128:
a median of 0 against 5,568 a step; replaying every malloc: 5,968; ``scripts/heap_trim_replay.py``).

So the workers run with ``malloc_log.c`` preloaded (``LD_PRELOAD``): it forwards every call to glibc's
own entry points and, while the point's first timed step runs, logs each one (the kind, size, pointer).  The rate
rounds between the timed steps replay the log (:meth:`MallocLog.replay`): each call made again in order,
each free on the block made for the one the step freed, one byte of every page written; the faults it
takes are the step's heap faults, and the blocks of a page or more that faulted give a fault's price (as
:func:`.heapfaults.replay_priced` prices the tensors').  The first timed step is the one logged: the memory
step runs under torch's profiler, whose own calls are ten times the step's and change what the heap does
(gpt2-tiny full 16 × 128: its log replayed took a median of 0 faults, against 5,568 a step).  The log is
a list of calls, nothing timed; keeping it costs that step a store per call.

The library is built here with the machine's C compiler into a cache (:func:`cache_dir`: beside the kept
answers of :mod:`ckptbench.answers`), keyed by its source and compiler; one that this user does not own, or that others
could write, is never loaded (a private temporary folder is built in instead).  Without a compiler or glibc, with ``LD_PRELOAD`` already set
(another allocator: preloading ours would bypass it) or with ``CKPTBENCH_MALLOC_LOG=0``, nothing is
preloaded and the rounds replay the tensors alone (:func:`.heapfaults.replay_priced`); the record says
which (``heap_replay``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from ..answers import cache_dir as answers_cache_dir

SOURCE = pathlib.Path(__file__).with_name("malloc_log.c")
OFF_VAR = "CKPTBENCH_MALLOC_LOG"  # "0": never preload it
BUILD_TIMEOUT_S = 120


def cache_dir() -> pathlib.Path:
    """``$CKPTBENCH_CACHE_DIR/malloc-log`` or ``$XDG_CACHE_HOME/ckptbench/malloc-log``
    (:func:`ckptbench.answers.cache_dir`); a private temporary folder where keeping is off."""
    kept = answers_cache_dir("malloc-log")
    return pathlib.Path(kept) if kept else pathlib.Path(tempfile.mkdtemp(prefix="ckptbench-malloc-log-"))


def build(directory: pathlib.Path | None = None) -> tuple[str | None, str]:
    """(the built library's path, "") or (None, why not).  Built once per source and compiler."""
    if os.environ.get(OFF_VAR) == "0":
        return None, f"{OFF_VAR}=0"
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None, "not Linux with glibc"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc) to build the malloc log"
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + cc.encode()).hexdigest()[:12]
    directory = directory or cache_dir()
    target = directory / f"malloc_log-{key}.so"
    if target.is_file() and _private(target) and _private(directory):
        return str(target), ""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(directory):  # a library others could have put there is never preloaded
            directory = pathlib.Path(tempfile.mkdtemp(prefix="ckptbench-malloc-log-"))
            target = directory / target.name
        partial = directory / f".malloc_log-{key}-{os.getpid()}.so"
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE)],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return None, f"{cc} could not build the malloc log: {last}"
        partial.chmod(0o755)  # whatever the umask: writable by this user alone
        os.replace(partial, target)  # whole or absent: a sweep beside this one never preloads half a file
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"the malloc log could not be built in {directory}: {e}"
    return str(target), ""


def _private(path: pathlib.Path) -> bool:
    """Owned by this user and writable by no one else: what may be loaded into every worker."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def preload_env(env: dict, library: str | None) -> str:
    """Add `library` to a child's environment `env` (in place); returns why not, "" when added."""
    if not library:
        return "not built"
    if env.get("LD_PRELOAD"):
        return f"LD_PRELOAD is already set ({env['LD_PRELOAD']}): another allocator's calls are not logged"
    env["LD_PRELOAD"] = library
    return ""


class MallocLog:
    """The preloaded log, in this process (None from :meth:`loaded` where it is not preloaded)."""

    def __init__(self, lib) -> None:
        self._lib = lib
        lib.mlog_on.argtypes = [ctypes.c_int]
        lib.mlog_events.restype = ctypes.c_uint64
        lib.mlog_dropped.restype = ctypes.c_uint64
        lib.mlog_replay.restype = ctypes.c_uint64
        lib.mlog_replay.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_long), ctypes.POINTER(ctypes.c_long),
                                    ctypes.POINTER(ctypes.c_double)]
        self.events = 0

    @classmethod
    def loaded(cls) -> MallocLog | None:
        lib = ctypes.CDLL(None)  # this process's global symbols: the preloaded library's come first
        return cls(lib) if hasattr(lib, "mlog_on") and hasattr(lib, "mlog_replay") else None

    def start(self) -> None:
        self._lib.mlog_on(1)

    def stop(self) -> None:
        self._lib.mlog_on(0)
        self.events = int(self._lib.mlog_events())

    @property
    def dropped(self) -> int:
        """Calls past the log's capacity (8 M): the replay lacks them."""
        return int(self._lib.mlog_dropped())

    def replay(self, clock=None) -> tuple[int, int, float]:
        """The logged calls made again: (minor faults taken, those of the blocks of a page or more that
        faulted, the seconds those blocks took), the seconds by this thread's CPU time where `clock` is
        :func:`time.thread_time`, else the wall clock."""
        faults, priced, seconds = ctypes.c_long(), ctypes.c_long(), ctypes.c_double()
        self._lib.mlog_replay(int(clock is time.thread_time), ctypes.byref(faults), ctypes.byref(priced),
                              ctypes.byref(seconds))
        return int(faults.value), int(priced.value), float(seconds.value)
