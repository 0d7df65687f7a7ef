"""Loading a real-run workload: a built-in set by name, or a workload JSON file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from solvers import InvalidProblem

from pollux_opt.workloads.job import Workload
from pollux_opt.workloads.sets import WORKLOAD_SETS

__all__ = ["load_workload"]


def load_workload(name_or_file: str | os.PathLike, *, quick: bool = False,
                  import_dir: str | os.PathLike | None = None) -> Workload:
    """A named set from :data:`~pollux_opt.workloads.sets.WORKLOAD_SETS`, or a
    workload JSON file (the shape of :meth:`Workload.to_json`), checked against
    the registered jobs; its quick variant if ``quick``.

    A file's jobs with an ``entry`` (a user's script or module, see
    ``docs/user-jobs.md``) are imported from ``import_dir`` if given, else
    from the job's own ``import_dir``, else from the directory of the file.

    Raises:
        InvalidProblem: unknown name, unreadable file or a bad field, naming it.
    """
    key = str(name_or_file)
    if key in WORKLOAD_SETS and import_dir is not None:
        raise InvalidProblem(f"an import directory applies to a workload file, not to the named set {key!r}")
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
        if import_dir is not None:
            wl = Workload.from_json(_with_import_dir(data, Path(import_dir).expanduser().resolve(), force=True))
        else:
            wl = Workload.from_json(_with_import_dir(data, path.parent.resolve(), force=False))
    wl = wl.quick() if quick else wl
    wl.check()
    return wl


def _with_import_dir(data, directory: Path, *, force: bool):
    """``data`` with ``import_dir`` set on each job that names an ``entry`` (if it has none, unless ``force``)."""
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        return data  # Workload.from_json names what is wrong
    def needs(job) -> bool:
        return isinstance(job, dict) and "entry" in job and (force or "import_dir" not in job)

    jobs = [dict(j, import_dir=str(directory)) if needs(j) else j for j in data["jobs"]]
    return dict(data, jobs=jobs)
