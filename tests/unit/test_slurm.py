"""The Slurm side without a cluster: the [slurm] table, the settings, and the job array sbatch receives.

submitit builds the sbatch script and runs ``sbatch``; here ``sbatch`` is a stand-in that keeps the
script and answers as Slurm does, so what is checked is exactly what a cluster would be handed.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys

import pytest

from ckptbench.run.submit import (
    JOBS_DIR,
    MANIFEST,
    SlurmSettings,
    make_executor,
    slurm_parameters,
    submit_shards,
)
from ckptbench.run.sweep import SweepOptions
from ckptbench.suite.keys import SuiteError
from ckptbench.suite.parse import load_suite, parse_suite
from tests.synthetic_run import ONE_POINT_SUITE

SUITE = """
[suite]
name = "six"

[model]
preset = "llama-tiny"
attn = "eager"

[sweep]
batch_size = [1, 2]
seq_len = [16]
every_n_layers = [0, 1, 2]

[slurm]
partition = "gpu"
time_min = 90
gpus_per_task = 1
jobs = 2
setup = ["source .venv/bin/activate"]
"""


def test_the_slurm_table_is_read_and_checked():
    suite = parse_suite(SUITE, "s.toml")
    assert suite.slurm == {"partition": "gpu", "time_min": 90, "gpus_per_task": 1, "jobs": 2,
                           "setup": ["source .venv/bin/activate"]}
    for bad, message in [("time_min = 0", "slurm.time_min: must be > 0"),
                         ("jobs = -1", "slurm.jobs: must be > 0"),
                         ('partition = 3', "slurm.partition: must be str"),
                         ('nodes = 2', "slurm.nodes: unknown key"),
                         ('setup = [1]', "slurm.setup: must be a list of shell lines")]:
        with pytest.raises(SuiteError, match=message):
            parse_suite(SUITE[:SUITE.index("[slurm]")] + f"[slurm]\n{bad}\n", "s.toml")


def test_flags_override_the_table_key_by_key():
    settings = SlurmSettings.merged({"partition": "gpu", "time_min": 90, "jobs": 2},
                                    {"partition": "debug", "time_min": None, "jobs": 8, "gpus_per_task": None})
    assert (settings.partition, settings.time_min, settings.jobs, settings.gpus_per_task) == ("debug", 90, 8, None)
    assert slurm_parameters(settings, "ckptbench-six") == {
        "job_name": "ckptbench-six", "nodes": 1, "ntasks_per_node": 1, "signal_delay_s": 90, "time": 90,
        "partition": "debug"}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """``srun`` for submitit's is-this-a-cluster check, and an ``sbatch`` that keeps the script it gets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kept = tmp_path / "sbatch-script.sh"
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {kept}\necho "Submitted batch job 4242"\n')
    for tool in ("srun", "sbatch"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return kept


def test_the_shards_go_to_slurm_as_one_job_array_with_the_settings(tmp_path, fake_slurm):
    path = tmp_path / "six.toml"
    path.write_text(SUITE)
    suite = load_suite(str(path))
    out = str(tmp_path / "run")
    settings = SlurmSettings.merged(suite.slurm, {"cpus_per_task": 8, "account": "proj", "mem_gib": 64})
    executor = make_executor("slurm", os.path.join(out, JOBS_DIR), settings, "ckptbench-six")
    jobs = submit_shards(suite, SweepOptions(out_dir=out, parallel=2), [1, 2], 2, executor, "slurm")

    assert [job.job_id for job in jobs] == ["4242_0", "4242_1"]
    script = fake_slurm.read_text().splitlines()
    for line in ("#SBATCH --array=0-1%2", "#SBATCH --partition=gpu", "#SBATCH --time=90",
                 "#SBATCH --gpus-per-task=1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=65536MB",
                 "#SBATCH --account=proj", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --job-name=ckptbench-six", "#SBATCH --signal=USR2@90", "source .venv/bin/activate"):
        assert line in script
    assert any(line.startswith("srun ") and "submitit.core._submit" in line for line in script)

    # what each array task will run: its own shard of the suite, resuming, into the shared directory
    for k, job in enumerate(jobs):
        with open(job.paths.submitted_pickle, "rb") as fh:
            call = pickle.load(fh).function
        assert call.options.shard == (k + 1, 2) and call.options.resume and call.options.parallel == 2
        assert call.options.out_dir == out and call.suite.cases == suite.cases
    with open(os.path.join(out, JOBS_DIR, MANIFEST)) as fh:
        (line,) = fh.read().splitlines()
    assert '"job_id": "4242_0", "shard": [1, 2]' in line and '"launcher": "slurm"' in line


def test_setup_lines_do_not_run_under_the_local_launcher(tmp_path):
    """[slurm] setup is for a Slurm job's script: a local job runs in this machine's shell as it is."""
    marker = tmp_path / "setup-ran"
    settings = SlurmSettings(setup=(f"touch {marker}",))
    executor = make_executor("local", str(tmp_path / JOBS_DIR), settings, "ckptbench-six")
    assert executor.submit(os.getpid).result() > 0
    assert not marker.exists()


ONE_POINT = ONE_POINT_SUITE + """
[slurm]
setup = ["{touch} {marker}", "{touch} {marker}-too"]
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_a_local_sweep_says_once_that_it_ignores_setup_and_runs_none_of_it(tmp_path):
    marker = tmp_path / "setup-ran"
    path = tmp_path / "one.toml"
    path.write_text(ONE_POINT.format(touch=shutil.which("touch"), marker=marker))  # the CLI's PATH has no touch
    proc = _sweep_cli("--out", str(tmp_path / "run"), "--launcher", "local", path=str(path))
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists() and not os.path.exists(f"{marker}-too")
    assert proc.stderr.count("[slurm] setup ignored under --launcher local") == 1


def _sweep_cli(*args: str, path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # no srun: not a Slurm node
    return subprocess.run([sys.executable, "-m", "ckptbench", "sweep", "--suite", path, *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_slurm_without_a_time_limit_or_without_slurm_is_one_line(tmp_path):
    path = tmp_path / "six.toml"
    path.write_text(SUITE.replace("time_min = 90\n", ""))
    out = str(tmp_path / "run")
    proc = _sweep_cli("--out", out, "--launcher", "slurm", path=str(path))
    assert proc.returncode == 2 and proc.stderr.startswith("error: --launcher slurm needs each job's time limit")
    proc = _sweep_cli("--out", out, "--launcher", "slurm", "--time-limit", "30", path=str(path))
    assert proc.returncode == 2 and proc.stderr.startswith('error: --launcher slurm: Could not detect "srun"')
    assert len(proc.stderr.splitlines()) == 1
    assert not os.path.exists(out)  # nothing submitted, nothing written
    proc = _sweep_cli("--out", out, "--launcher", "local", "--shard", "1/2", path=str(path))
    assert proc.returncode == 2 and "--shard and --launcher do not go together" in proc.stderr
    proc = _sweep_cli("--out", out, "--jobs", "4", "--partition", "gpu", path=str(path))
    assert proc.returncode == 2 and proc.stderr == "error: --partition, --jobs only mean something with --launcher local|slurm\n"
    assert not os.path.exists(out)  # nothing was run or written
