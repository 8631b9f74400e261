"""What every command pays before it runs: building the parser must not import numpy, torch or the record
store, and the texts it reads from source instead must stay those modules' own."""

import subprocess
import sys

from ckptbench.cli.report import compare_help
from ckptbench.store.compare import HELP


def test_compare_help_read_from_source_is_the_modules_own_text():
    assert compare_help() == HELP
    assert "For other code" not in compare_help()


def test_building_the_parser_imports_no_numpy_torch_or_record_store():
    code = ("import sys; from ckptbench.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('numpy', 'torch', 'ckptbench.store.records', 'ckptbench.store.compare') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_env_probe_reports_a_child_that_cannot_start(monkeypatch):
    from ckptbench.run import environment

    def refuse(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "python")

    monkeypatch.setattr(environment.subprocess, "Popen", refuse)
    assert environment.probe_torch()["torch_probe_error"].startswith("FileNotFoundError")
