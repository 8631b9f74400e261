"""``report RUN --csv/--parquet``: the report's table, one row per point, read back as it was written."""

import json
import os

import pandas as pd
import pytest

from ckptbench.cli import main
from ckptbench.store.records import load_records

RUN = os.path.join(os.path.dirname(__file__), "..", "..", "results", "reference-cpu")


def test_csv_and_parquet_hold_every_point_with_its_figures(tmp_path, capsys):
    csv, parquet = tmp_path / "out" / "t.csv", tmp_path / "t.parquet"
    assert main(["report", RUN, "--csv", str(csv), "--parquet", str(parquet)]) == 0
    records = load_records(RUN).records
    by_id = {r["case_id"]: r for r in records}
    assert not list(tmp_path.glob("*.html")) and not os.path.exists("reports/reference-cpu.html.tmp")
    for frame in (pd.read_csv(csv), pd.read_parquet(parquet)):
        assert sorted(frame["case_id"]) == sorted(by_id)
        for _, row in frame.iterrows():
            m = by_id[row["case_id"]]["measurement"]
            assert row["peak"] == m["peak_bytes"]
            assert json.loads(row["step_times"]) == pytest.approx(m["step_times_s"], rel=1e-12)
    typed = pd.read_parquet(parquet)
    assert typed["peak"].dtype == "float64" and typed["ok"].dtype == bool
    assert "table: " in capsys.readouterr().err


def test_an_unwritable_export_path_is_one_line_and_leaves_nothing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["report", RUN, "--csv", str(blocker / "t.csv")]) in (2, 4)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "t.csv" in errors[0] and "Traceback" not in err
    assert os.listdir(tmp_path) == ["file"]


def test_a_directory_given_as_the_export_file_is_refused(tmp_path, capsys):
    assert main(["report", RUN, "--parquet", str(tmp_path)]) == 2
    assert "--parquet" in capsys.readouterr().err
