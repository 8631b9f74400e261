"""The workers' malloc log: built with the machine's compiler (once per source), never forced over another
preloaded allocator, and, preloaded into a child, logging exactly the calls made while it is on and
replaying them with their page faults."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ckptbench.measure import malloclog
from ckptbench.measure.malloclog import MallocLog, build, preload_env


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    path, why = build(tmp_path_factory.mktemp("malloc-log"))
    if path is None:
        pytest.skip(f"no malloc log here: {why}")
    return path


def test_it_is_built_once_per_source_and_not_at_all_without_a_compiler_or_when_turned_off(library, tmp_path,
                                                                                       monkeypatch):
    again, why = build(pathlib.Path(library).parent)
    assert (again, why) == (library, "") and os.path.getmtime(again) == os.path.getmtime(library)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    path, why = build(tmp_path / "elsewhere")
    assert path is None and "could not be built" in why and not list((tmp_path / "elsewhere").glob("*.so"))
    monkeypatch.setenv(malloclog.OFF_VAR, "0")
    assert build(tmp_path / "off") == (None, f"{malloclog.OFF_VAR}=0")


def test_another_preloaded_allocator_is_left_alone():
    theirs = {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}
    assert "already set" in preload_env(theirs, "/x/malloc_log.so")
    assert theirs == {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}
    ours: dict = {}
    assert preload_env(ours, "/x/malloc_log.so") == "" and ours == {"LD_PRELOAD": "/x/malloc_log.so"}
    assert preload_env(ours, None) == "not built"
    assert MallocLog.loaded() is None or "LD_PRELOAD" in os.environ  # this process has none preloaded


CHILD = r"""
import ctypes, json, time
from ckptbench.measure.malloclog import MallocLog
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.realloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
BIG = 64 << 20  # beyond glibc's largest mmap threshold: mapped afresh, every page a fault
log = MallocLog.loaded()
before = libc.malloc(BIG)  # made before the log: its free is logged, and skipped by the replay
log.start()
a = libc.malloc(BIG)
libc.free(before)
box = ctypes.c_void_p()
assert libc.posix_memalign(ctypes.byref(box), 64, BIG) == 0
libc.free(a)
b = libc.realloc(libc.malloc(4096), BIG)  # a small block grown into a big one
libc.free(box.value)
log.stop()
calls = log.events
replays = [log.replay(time.thread_time) for _ in range(2)]
libc.free(b)
print(json.dumps({"calls": calls, "dropped": log.dropped, "replays": replays}))
"""


def test_a_preloaded_child_logs_its_calls_and_the_replay_faults_on_every_page_of_each_big_block(library):
    """malloc, free (of a block from before the log), posix_memalign, free, malloc, realloc, free: seven calls;
    replayed, three blocks of 16,384 pages each are mapped afresh (the skipped free frees nothing), each
    written once, every fault theirs and priced."""
    env = dict(os.environ, LD_PRELOAD=library)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["calls"] == 7 and out["dropped"] == 0
    pages = (64 << 20) // 4096
    for faults, priced, seconds in out["replays"]:
        assert 3 * pages <= faults <= 3 * pages + 64, out
        assert 3 * pages <= priced <= faults and seconds > 0, out


def test_a_library_or_folder_others_could_write_is_never_loaded(library, tmp_path):
    """A cached library in a folder anyone may write to could be anyone's: built afresh in a private
    folder instead, and one that others may write to is rebuilt."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    path, why = build(shared)
    assert why == "" and path is not None and not path.startswith(str(shared))
    assert malloclog._private(pathlib.Path(path)) and malloclog._private(pathlib.Path(path).parent)
    mine = tmp_path / "mine"
    first, _ = build(mine)
    os.chmod(first, 0o666)  # writable by others: not trusted, built again over it
    again, _ = build(mine)
    assert again == first and malloclog._private(pathlib.Path(again))
