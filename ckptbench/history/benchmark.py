"""asv benchmarks that measure training with ckptbench: a suite's points, or your own training steps.

In a module of asv's benchmark directory (``ckptbench asv init`` writes one)::

    from ckptbench.history.benchmark import step_benchmark, suite_benchmark

    Training = suite_benchmark("suites/smoke.toml")       # every point of a suite
    Steps = step_benchmark(tiny=build_tiny_step)          # or steps: name -> () -> (model, optimizer, batch, step)

asv runs a class's ``setup_cache`` once per commit and environment: it measures every point (a sweep of the
suite, or each step as the ``ckptbench_step`` fixture does) and keeps the records under asv's results
directory, ``<results_dir>/ckptbench/<machine>/<environment>/<commit>/``, where ``ckptbench history`` reads
them.  The ``track_*`` methods give asv one figure each per point: peak bytes, median step seconds, tokens/s.
A point that did not run ``ok`` (oom, crash, timeout) raises, so asv records it as failed, and its record
says why.  One class of each kind per module: asv keys a setup cache by the line it is defined on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

HISTORY_DIR_ENV = "CKPTBENCH_HISTORY_DIR"  # where records go instead of <asv results_dir>/ckptbench
COMMIT_ENV = "CKPTBENCH_COMMIT"  # the commit measured, when neither asv nor git can tell
RECORDS_DIR = "ckptbench"  # under asv's results directory
MACHINE_FILE = "machine.json"  # in each machine's directory: what its key was made of
FIGURES = {"peak_bytes": "bytes", "step_time_median_s": "seconds", "tokens_per_s": "tokens/s"}


def _asv_results_dir(conf_dir: str) -> str:
    """asv.conf.json's ``results_dir`` (asv reads the file as JSON with comments), relative to its folder."""
    path = os.path.join(conf_dir, "asv.conf.json")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        conf = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    except (OSError, ValueError):
        conf = {}
    results = conf.get("results_dir", "results") if isinstance(conf, dict) else "results"
    return os.path.join(conf_dir, results if isinstance(results, str) else "results")


def conf_dir(benchmark_file: str | None) -> str:
    """The folder of asv.conf.json: asv's ``$ASV_CONF_DIR`` (a built environment), else the nearest folder
    above the benchmark module holding one (asv gives a ``--python=same`` run neither the variable nor a
    working directory in the repository), else the working directory."""
    if os.environ.get("ASV_CONF_DIR"):
        return os.environ["ASV_CONF_DIR"]
    here = os.path.dirname(os.path.abspath(benchmark_file)) if benchmark_file else os.getcwd()
    while True:
        if os.path.isfile(os.path.join(here, "asv.conf.json")):
            return here
        up = os.path.dirname(here)
        if up == here:
            return os.getcwd()
        here = up


def history_dir(conf: str) -> str:
    """Where this run's records go: ``$CKPTBENCH_HISTORY_DIR``, else ``<asv results_dir>/ckptbench``."""
    if os.environ.get(HISTORY_DIR_ENV):
        return os.environ[HISTORY_DIR_ENV]
    return os.path.join(_asv_results_dir(conf), RECORDS_DIR)


def commit_measured(conf: str) -> str:
    """The commit being measured: asv's (a built environment), else ``$CKPTBENCH_COMMIT``, else the HEAD of
    the repository asv.conf.json is in (``asv run --python=same --set-commit-hash HEAD`` measures what is
    checked out)."""
    for name in ("ASV_COMMIT", COMMIT_ENV):
        if os.environ.get(name):
            return os.environ[name]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=conf, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is None or out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError("ckptbench: cannot tell which commit is measured (no ASV_COMMIT, no CKPTBENCH_COMMIT, "
                           "not in a git repository)")
    return out.stdout.strip()


def machine() -> tuple[str, dict]:
    """This machine's key and what it is made of: the CPU, its core count and the accelerator, the things
    that move step times.  Not the host name: a CI service gives each run a new one on the same hardware."""
    import torch

    from ..base.env import cpu_model

    parts = {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
             "accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    return digest, parts


def _torch_version() -> str:
    import torch

    return torch.__version__


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", name)[:120] or "-"


def run_dir(conf: str) -> str:
    """This commit's directory: ``<history>/<machine>/<environment>/<commit>``, the machine's file written."""
    key, parts = machine()
    machine_dir = os.path.join(history_dir(conf), key)
    os.makedirs(machine_dir, exist_ok=True)
    path = os.path.join(machine_dir, MACHINE_FILE)
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(parts, fh, indent=1)
    env = _safe(os.environ.get("ASV_ENV_NAME") or f"same-py{sys.version.split()[0]}-torch{_torch_version()}")
    return os.path.join(machine_dir, env, _safe(commit_measured(conf)))


def kept(measure: Callable[[str], None], final: str) -> None:
    """Run ``measure(directory)`` into a new directory beside `final`, then put it in `final`'s place: a run
    killed or failing half-way leaves the commit's earlier records as they were."""
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".partial-", dir=parent)
    try:
        measure(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    old = None
    if os.path.exists(final):
        old = tempfile.mkdtemp(prefix=".replaced-", dir=parent)
        os.rename(final, os.path.join(old, "run"))
    os.rename(work, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def figures(records: list[dict]) -> dict[str, dict]:
    """What asv is given, by Case id: status, reason and the three figures."""
    from ..store.schema import typed

    return {r.case_id: {"status": r.status, "reason": r.reason or "", **{k: getattr(r.measurement, k) for k in FIGURES}}
            for r in typed(records)}


def _figure(cache: dict, point: str, key: str):
    entry = cache.get(point)
    if entry is None:
        raise RuntimeError(f"ckptbench: {point} was not measured at this commit")
    if entry["status"] != "ok" or entry.get(key) is None:
        raise RuntimeError(f"ckptbench: {point} is {entry['status']}: {entry['reason'] or 'no ' + key}")
    return entry[key]


def kernel_readings(out: str, at: str) -> list[str]:
    """The calibration kernel timed in this process, where the steps run, as a sweep times it at its start
    and end (``calibration.jsonl``): what lets the history divide out a change of the machine's speed.  What
    went wrong, one line each (the history then judges raw changes)."""
    import torch

    from ..measure.speed import time_kernel
    from ..run.speed_reading import append_readings

    def read(device: str, threads: int) -> dict:
        try:
            return time_kernel(device, threads)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    return append_readings(out, at, "cpu", torch.get_num_threads(), read)


class _Track:
    """The asv side shared by both kinds: one parameter (the point), three tracked figures."""

    param_names = ["point"]
    timeout = 3600  # a commit's whole measurement runs in setup_cache, under this limit
    rounds = 1  # the figures come from one measurement per commit, its repeats inside ckptbench's record
    repeat = 1
    number = 1

    def track_peak_bytes(self, cache, point):
        return _figure(cache, point, "peak_bytes")

    def track_step_time(self, cache, point):
        return _figure(cache, point, "step_time_median_s")

    def track_tokens_per_s(self, cache, point):
        return _figure(cache, point, "tokens_per_s")

    track_peak_bytes.unit = FIGURES["peak_bytes"]
    track_step_time.unit = FIGURES["step_time_median_s"]
    track_tokens_per_s.unit = FIGURES["tokens_per_s"]


def point_labels(cases) -> dict[str, str]:
    """A readable, unique asv parameter per Case: model, strategy, batch, sequence (the id when two agree)."""
    labels = [f"{c.model.name} {c.strategy} b{c.batch_size} s{c.seq_len}" for c in cases]
    return {(label if labels.count(label) == 1 else f"{label} {c.id}"): c.id for label, c in zip(labels, cases)}


def suite_benchmark(path: str, repeats: int | None = None) -> type:
    """An asv benchmark class over every point of the suite at `path` (relative to asv.conf.json's folder,
    or absolute): each commit is one sweep of it, its records kept for ``ckptbench history``."""
    from ..suite.parse import load_suite

    conf = conf_dir(sys._getframe(1).f_globals.get("__file__"))
    suite_path = path if os.path.isabs(path) else os.path.join(conf, path)
    suite = load_suite(suite_path)
    labels = point_labels(suite.cases)

    class SuiteTraining(_Track):
        params = [list(labels)]
        version = hashlib.sha256((suite.text or suite_path).encode()).hexdigest()[:16]  # the suite, not ckptbench

        def setup_cache(self):
            from ..run.sweep import SweepOptions, run_sweep
            from ..store.records import load_records

            kept(lambda out: run_sweep(suite, SweepOptions(out_dir=out, repeats=repeats)), final := run_dir(conf))
            by_id = figures(load_records(final).records)
            return {label: by_id.get(case_id) for label, case_id in labels.items()}

    SuiteTraining.setup_cache.timeout = SuiteTraining.timeout
    SuiteTraining.__name__ = SuiteTraining.__qualname__ = "SuiteTraining"
    return SuiteTraining


def step_benchmark(repeats: int = 3, **steps: Callable[[], tuple]) -> type:
    """An asv benchmark class over your own training steps: each keyword names a function returning
    ``(model, optimizer, batch, step)`` as the ``ckptbench_step`` fixture takes them; each commit measures
    each step as a tracked run (warm-up, the memory step, timed steps) in `repeats` processes of its own
    (:mod:`.step_repeat`: the history's time test is then across processes) and keeps the records.  With
    ``repeats=1`` the step runs in asv's process and its function may be anything callable."""
    from .step_repeat import reference

    if not steps:
        raise ValueError("step_benchmark needs at least one step: name=function returning "
                         "(model, optimizer, batch, step)")
    if repeats < 1:
        raise ValueError(f"step_benchmark: repeats is {repeats!r}, not a count of processes (1 or more)")
    if repeats > 1:
        for build in steps.values():
            reference(build)  # refused here, when asv imports the module, not once per commit
    conf = conf_dir(sys._getframe(1).f_globals.get("__file__"))

    class StepTraining(_Track):
        params = [list(steps)]
        version = "1"  # the steps' own code changes with the commits: that is what is measured

        def setup_cache(self):
            from ..store.records import RecordStore, load_records
            from ..track import measure_step
            from .step_repeat import measure_in_processes

            def one(name: str, build, out: str) -> str:
                """Measure one step into `out`; what went wrong, or ''."""
                if repeats == 1:
                    return "" if measure_step(*build(), out=out, name=name) is not None else "the step was not measured"
                records, problem = measure_in_processes(name, build, out, repeats)
                store = RecordStore(out)
                for record in records:
                    store.append(record)
                return problem if not records else ""

            def measure(out: str) -> dict:
                kernel_readings(out, "start")
                failed = {}
                for name, build in steps.items():
                    try:  # this commit's code may not build or run its step: that point failed, the rest go on
                        failed[name] = one(name, build, out)
                    except Exception as exc:
                        failed[name] = f"{type(exc).__name__}: {exc}"
                kernel_readings(out, "end")
                by_name = {r.get("suite", "").removeprefix("track:"): r for r in load_records(out).records}
                return {name: ({"status": "crash", "reason": why} if why or name not in by_name
                               else figures([by_name[name]])[by_name[name]["case_id"]])
                        for name, why in failed.items()}

            result = {}
            kept(lambda out: result.update(measure(out)), run_dir(conf))
            return result

    StepTraining.setup_cache.timeout = StepTraining.timeout
    return StepTraining
