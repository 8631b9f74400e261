"""The memory readings a sweep judges by: checked against the kernel's other accounts of the same figures."""

from __future__ import annotations

import mmap
import os
import resource

from ckptbench.run.hostmem import HostMemory, WorkerWatch, explain_kill, read_host_memory, resident_bytes

GIB = 2**30


def test_total_memory_agrees_with_sysconf():
    host = read_host_memory()
    assert host.total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < host.available <= host.total
    assert 0 < host.usable <= host.available


def test_own_high_water_mark_agrees_with_getrusage():
    rss, hwm = resident_bytes(os.getpid())
    # raise the high-water mark by a known amount, then read both accounts: fresh pages of an anonymous map,
    # each written (a malloc'd buffer can reuse heap the process already holds resident: after a test that
    # freed a gigabyte in the same worker, 64 MiB of bytes left VmRSS unchanged to the byte)
    held = mmap.mmap(-1, 64 * 2**20)
    for page in range(0, len(held), mmap.PAGESIZE):
        held[page] = 1
    rss2, hwm2 = resident_bytes(os.getpid())
    assert rss2 >= rss + 60 * 2**20 and hwm2 >= rss2
    # the same high-water mark through getrusage (KiB on Linux); the kernel folds each thread's cached RSS
    # delta (up to 64 pages a thread) into the two accounts at different moments, hence the slack
    assert abs(hwm2 - resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) <= 2**20
    held.close()


def test_a_process_that_is_gone_has_no_figures():
    assert resident_bytes(2**22 + 12345) is None  # above the default pid_max


def test_the_container_allowance_caps_what_is_usable():
    assert HostMemory(total=24 * GIB, available=20 * GIB, cgroup_limit=8 * GIB, cgroup_usage=6 * GIB).usable == 2 * GIB
    assert HostMemory(total=24 * GIB, available=20 * GIB, cgroup_limit=8 * GIB).capacity == 8 * GIB
    assert HostMemory().usable is None


def _watch(peak: int, cap=None, before=HostMemory(), last=None) -> WorkerWatch:
    watch = WorkerWatch(pid=0, cap=cap, before=before)
    watch.peak_rss, watch.last_host, watch.samples = peak, last, 3
    return watch


def test_sigkill_is_oom_only_with_figures_that_say_so():
    roomy = HostMemory(total=24 * GIB, available=20 * GIB)
    # nothing says memory: a kill -9 by hand stays a crash
    assert explain_kill(_watch(2 * GIB, last=roomy), roomy) is None
    # the machine had under 5 % available at the last look
    tight = HostMemory(total=24 * GIB, available=GIB // 2)
    why = explain_kill(_watch(20 * GIB, last=tight), tight)
    assert why.startswith("killed by SIGKILL while memory ran out") and "0.5 GiB" not in why
    assert "512.0 MiB of the machine's 24.00 GiB was available" in why and "20.00 GiB at its peak" in why
    # the kernel counted an OOM kill in our cgroup while the worker ran
    why = explain_kill(_watch(GIB, before=HostMemory(oom_kills=2), last=roomy), HostMemory(oom_kills=3))
    assert why.startswith("killed by the kernel's OOM killer") and "from 2 to 3" in why


def test_holding_most_of_the_memory_cap_is_no_sign_of_oom():
    """Nothing kills at --memory-gib but the sweep itself, which labels its own stops."""
    roomy = HostMemory(total=24 * GIB, available=20 * GIB)
    assert explain_kill(_watch(int(0.95 * 4 * GIB), cap=4 * GIB, last=roomy), roomy) is None


def test_an_early_dip_in_available_memory_does_not_label_a_later_kill(monkeypatch):
    """The last look before the death decides, not the run's lowest one."""
    from ckptbench.run import hostmem

    tight = HostMemory(total=24 * GIB, available=GIB // 2)
    roomy = HostMemory(total=24 * GIB, available=20 * GIB)
    looks = iter([roomy, tight, roomy, roomy])  # before, then three samples
    monkeypatch.setattr(hostmem, "read_host_memory", lambda: next(looks))
    watch = WorkerWatch(pid=os.getpid(), before=hostmem.read_host_memory())
    for _ in range(3):
        watch.sample()
    assert watch.samples == 3
    assert explain_kill(watch, roomy) is None


def test_against_the_memory_cap_a_point_needs_the_workers_baseline_too():
    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec
    from ckptbench.run.fits import WORKER_BASELINE_BYTES, estimated_peak, too_big

    case = Case(model=preset("llama-tiny"), train=TrainSpec(), batch_size=1, seq_len=8)
    peak = estimated_peak(case)
    roomy = HostMemory(total=2**40, available=2**40)
    # the tensors alone fit under the cap, but the worker starts with the fork server's imports resident
    cap = peak + WORKER_BASELINE_BYTES - 1
    why = too_big(case, cap, roomy)
    assert why is not None and "worker baseline" in why and "--memory cap" in why
    assert too_big(case, cap + 1, roomy) is None
    assert too_big(case, peak + 1000, roomy, baseline=1000) is None  # the baseline a worker reported
    assert too_big(case, peak + 999, roomy, baseline=1000) is not None
    # against the RAM available the fork server's pages are already spent: only the estimate counts
    assert too_big(case, None, HostMemory(total=2**40, available=peak)) is None


def test_a_worker_reports_its_resident_memory_before_its_step(tmp_path):
    import json
    import multiprocessing

    from ckptbench.point.case import Case, preset
    from ckptbench.point.training import TrainSpec
    from ckptbench.run import worker

    case = Case(model=preset("llama-tiny"), train=TrainSpec(warmup_steps=0, steps=1), batch_size=1, seq_len=8)
    out = tmp_path / "r.json"
    proc = multiprocessing.get_context("fork").Process(
        target=worker.child_main, args=(case.to_dict(), str(out), str(tmp_path / "w.log"), 0.0))
    proc.start()
    proc.join(120)
    result = json.loads(out.read_text())
    assert result["status"] == "ok"
    # this process imported torch and transformers: its forked worker holds at least that much already
    assert result["baseline_rss_bytes"] > 100 * 2**20
