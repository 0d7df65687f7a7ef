"""Loading a real-run workload: a built-in set by name, or a workload JSON file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from solvers import InvalidProblem

from pollux_opt.workloads.job import Workload
from pollux_opt.workloads.sets import WORKLOAD_SETS

__all__ = ["load_workload"]


def load_workload(name_or_file: str | os.PathLike, *, quick: bool = False) -> Workload:
    """A named set from :data:`~pollux_opt.workloads.sets.WORKLOAD_SETS`, or a
    workload JSON file (the shape of :meth:`Workload.to_json`), checked against
    the registered jobs; its quick variant if ``quick``.

    Raises:
        InvalidProblem: unknown name, unreadable file or a bad field, naming it.
    """
    key = str(name_or_file)
    if key in WORKLOAD_SETS:
        wl = WORKLOAD_SETS[key]
    else:
        path = Path(key)
        if not path.is_file():
            raise InvalidProblem(
                f"workload {key!r} is neither a named set ({sorted(WORKLOAD_SETS)}) nor a file"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidProblem(f"workload file {key!r} is not readable JSON: {exc}") from exc
        wl = Workload.from_json(data)
    wl = wl.quick() if quick else wl
    wl.check()
    return wl
