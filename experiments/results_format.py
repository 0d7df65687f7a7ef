"""Markdown formatting shared by the sections of ``docs/results.md``
(:mod:`results_doc` and its section modules): tables, numbers, policy names,
the results folder's link and the error a bad CSV raises."""

from __future__ import annotations

import math
from typing import Sequence


class ResultsError(Exception):
    """A results CSV is missing, or lacks a column, or the README lacks the markers."""


#: Where the CSVs and plots are, as a link from docs/results.md.
RESULTS_LINK = "../experiments/results"
#: Display names of the simulator's policies, in table order.
POLICY_NAMES = {"pollux": "Pollux", "tiresias": "Tiresias+tuned", "optimus": "Optimus+Oracle+tuned"}
#: Display names of the real executor's policies, in table order.
REAL_POLICY_NAMES = {"fixed": "fixed", "dynamic": "dynamic", "pollux": "pollux", "fair-jct": "fair-jct"}


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> list[str]:
    """A GitHub markdown table (``right[i]``: right-align column i); cells are escaped for ``|``."""
    right = list(right) if right is not None else [False] * len(header)
    if len(right) != len(header) or any(len(r) != len(header) for r in rows):
        raise ValueError(f"table rows must have {len(header)} cells")

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), line(["---:" if r else "---" for r in right]), *(line(r) for r in rows)]


def seconds(v: float) -> str:
    return "-" if missing(v) else f"{v:.0f}"


def pct(v: float, digits: int = 0) -> str:
    """A fraction as a percentage."""
    return "-" if missing(v) else f"{100 * v:.{digits}f} %"


def ms(v: float) -> str:
    return "-" if missing(v) else f"{1000 * v:.0f}"


def short(v: float) -> str:
    """Two significant figures below 10, whole numbers above (wall seconds, rho)."""
    return "-" if missing(v) else (f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}")


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def machine_note(df) -> str:
    """" Measured on M." for a table whose CSV names its machine (``machine`` column), else ""."""
    names = [m for m in machines([df], "") if m]  # a row without a name is left out
    return f" Measured on {' and '.join(names)}." if names else ""


def machines(frames, default: str) -> list[str]:
    """The distinct machines that ``frames`` (DataFrames or None) name in their ``machine`` column, in
    order; a frame without the column, or a row without a name, counts as ``default``."""
    names: list[str] = []
    for df in frames:
        if df is None:
            continue
        col = df["machine"] if "machine" in df.columns else [None] * len(df)
        names += [default if missing(m) else str(m) for m in col]
    return list(dict.fromkeys(names))


def ordered(values, order: dict[str, str]) -> list[str]:
    present = list(dict.fromkeys(values))
    return [p for p in order if p in present] + sorted(p for p in present if p not in order)


def display_name(policy: str, names: dict[str, str] = POLICY_NAMES) -> str:
    return names.get(policy, policy)


def reduction(ours: float, baseline: float) -> float:
    """How far ``ours`` is below ``baseline``, as a fraction of ``baseline``."""
    return 1.0 - ours / baseline


def workload_key(name: str) -> tuple:
    """Sort key of a workload name: ``workload-10`` after ``workload-9``."""
    stem, _, num = str(name).rpartition("-")
    return (stem, int(num)) if num.isdigit() else (str(name), -1)
