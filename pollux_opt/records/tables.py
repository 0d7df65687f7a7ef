"""Reading a CSV table a user supplies (a workload, a profile's measurements), with clear errors.

:func:`read_table` reads the file as UTF-8 text, parses it with pandas, and
checks that the columns it needs are there and that the numeric ones hold
finite numbers; anything else is an :class:`~solvers.InvalidProblem` naming
the file (and the row and column of a bad cell), never a pandas traceback.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.model.domains import shown
from pollux_opt.model.validate import read_utf8

__all__ = ["INTEGER_DIGITS", "read_table"]

#: Digits an integer cell may have: every such value fits an int64 (< 9.2e18).
INTEGER_DIGITS = 18


def read_table(
    path: str | os.PathLike,
    what: str,
    *,
    columns: Sequence[str],
    numeric: Sequence[str] = (),
    integer: Sequence[str] = (),
    text: Sequence[str] = (),
    allow_empty: bool = False,
) -> pd.DataFrame:
    """The table in the CSV file ``path`` (``what`` names it in messages, e.g. "workload").

    Args:
        columns: columns that must be present (others are kept).
        numeric: columns whose every cell must be a finite number.
        integer: columns whose every cell must be an integer (read as int64).
        text: columns read as strings, exactly as written (e.g. ids, "1213"-style placements).
        allow_empty: accept a header without rows.

    Raises:
        InvalidProblem: a missing or unreadable file, bytes that are not UTF-8,
            no header, malformed CSV, a missing column, no rows, or a cell of
            a numeric column that is not a finite number.
    """
    where = f"{what} {str(Path(path))!r}"
    content = read_utf8(path, what)
    try:
        df = pd.read_csv(io.StringIO(content), dtype={c: str for c in text}, keep_default_na=False,
                         na_values={c: [""] for c in (*numeric, *integer)})
    except pd.errors.EmptyDataError:
        raise InvalidProblem(f"{where} is empty (no header row)") from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise InvalidProblem(f"{where} is not a well-formed CSV table: {str(exc).strip()[:200]}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InvalidProblem(f"{where} lacks columns {missing} (it has {list(df.columns)[:20]})")
    if df.empty and not allow_empty:
        raise InvalidProblem(f"{where} has no rows")
    for c in (*numeric, *integer):
        values = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        kind = "a finite number"
        if c in integer:
            kind = f"an integer of at most {INTEGER_DIGITS} digits"
            bad |= np.abs(values) >= 10.0**INTEGER_DIGITS
            if not pd.api.types.is_integer_dtype(df[c]):
                bad |= np.array([not str(x).strip().lstrip("+-").isdigit() for x in df[c]], dtype=bool)
        first = np.flatnonzero(bad)
        if first.size:
            cell = df[c].iloc[first[0]]
            cell = cell.item() if isinstance(cell, np.generic) else cell
            raise InvalidProblem(f"{where}: row {first[0] + 1}, column {c!r} must be {kind}, got {shown(cell)}")
    # Numbers keep the dtype pandas gave them (the simulator's results depend on
    # the exact values, which a conversion must not change); integers as int64.
    return df.astype({c: np.int64 for c in integer})
