"""What every command pays before it runs: building the parser must not import numpy, torch or the record
store, and the texts it reads from source instead must stay those modules' own."""

import subprocess
import sys

from ckptbench.cli import main
from ckptbench.cli.report import compare_help, plain_text
from ckptbench.store.compare import HELP


def test_compare_help_read_from_source_is_the_modules_own_text_without_markup():
    assert compare_help() == plain_text(HELP)
    assert "For other code" not in compare_help()
    assert "``" not in compare_help() and ":func:" not in compare_help() and "**" not in compare_help()
    assert "--no-drift-correction judges raw changes always" in compare_help()


def test_plain_text_keeps_the_words_of_marked_up_text():
    assert plain_text("a ``--repeat 3`` run, *noisy*, **Memory**, :func:`~.stats.median_cis`") == \
        "a --repeat 3 run, noisy, Memory, stats.median_cis"


def test_no_command_help_shows_markup(capsys):
    for command in ("sweep", "env", "models", "plan", "report", "compare", "estimate", "status"):
        try:
            main([command, "--help"])
        except SystemExit:
            pass
        out = capsys.readouterr().out
        assert "``" not in out and ":func:" not in out and ":mod:" not in out, command


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
