"""``ckptbench report RUN --csv FILE --parquet FILE``: the tidy table the report is drawn from, as a file.

One row per point (repeats merged, as the report shows them), one column per figure, the report's own
short names (``report.columns.COLUMNS`` says where each comes from in a record).  Values that are not
scalars (the step times, the checks, the layers recomputed) are JSON text, so a spreadsheet or
``pandas.read_csv`` reads every cell and ``json.loads`` gives back the list.  Parquet keeps the column
types (numbers as float64, flags as bool).  Both files are written atomically: a reader sees the old file
or the whole new one.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from ..store.files import atomic_path
from .columns import record_frame, tidy


def _cell(value):
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def export_frame(records: list[dict]) -> pd.DataFrame:
    """The report's tidy table with every non-scalar cell as JSON text."""
    t = tidy(record_frame(records))
    out = {}
    for column in t.columns:
        values = t[column]
        if values.dtype == object:
            out[column] = pd.Series([_cell(v) for v in values], index=t.index, dtype=object)
        else:
            out[column] = values
    return pd.DataFrame(out, index=t.index).reset_index(drop=True)


def write_exports(records: list[dict], csv: str | None = None, parquet: str | None = None) -> list[str]:
    """Write the table to each path given; the paths written, in order."""
    frame = export_frame(records)
    written = []
    for path, write in ((csv, _write_csv), (parquet, _write_parquet)):
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            with atomic_path(path) as tmp:
                os.makedirs(parent, exist_ok=True)
                write(frame, tmp)
            written.append(path)
    return written


def _write_csv(frame: pd.DataFrame, path: str) -> None:
    frame.to_csv(path, index=False)


def _write_parquet(frame: pd.DataFrame, path: str) -> None:
    typed = frame.copy()
    for column in typed.columns:
        if typed[column].dtype == object:  # text, or None where a record lacks the field
            typed[column] = [None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)
                             for v in typed[column]]
    typed.to_parquet(path, index=False, engine="pyarrow")
