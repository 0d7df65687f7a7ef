"""Atomic file writes: a reader finds the old file or the complete new one, never a torn one.

Everything a run writes whole (run configurations, summaries, checkpoints and
their metadata, job state files, CSV tables, figures) goes through one primitive,
:func:`atomic_write_bytes`:

1. the data is written to a temporary file in the target's own directory (so
   that the rename below never crosses a file system), named
   ``.<name>.tmp-<pid>-<random>`` so that concurrent writers (the scheduler and
   a job's workers) never share one;
2. the file is flushed and ``fsync``'ed, so its bytes are on disk before its name is;
3. ``os.replace`` renames it over the target (atomic on POSIX: a crash leaves
   the old file or the new one);
4. the directory is ``fsync``'ed, so that the rename itself survives a power loss.

If any step fails the temporary file is removed and the target is left as it
was.  :func:`atomic_write_text`, :func:`atomic_write_json` and
:func:`atomic_write_csv` encode and call it.

Every name that becomes a path component (job ids, job kinds and spec names,
workload names, exported application names, run subfolders) passes
:func:`safe_name` first, so that a name read from a file (``"../victim"``,
``"/etc"``, ``".."``) can never reach outside the folder it is joined to.

This module lives in :mod:`pollux_opt.records` (what runs write to disk), which
the runtime, the backends and the workloads already depend on, so it adds no
dependency between layers.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from solvers import InvalidProblem

from pollux_opt.model.domains import NAME, check

__all__ = ["MAX_NAME_CHARS", "atomic_write_bytes", "atomic_write_csv", "atomic_write_json", "atomic_write_text",
           "drop_torn_line", "safe_name"]

#: Longest name :func:`safe_name` admits: Linux's NAME_MAX (bytes of one path
#: component; a safe name is ASCII, one byte a character).
MAX_NAME_CHARS = 255

log = logging.getLogger(__name__)


def safe_name(kind: str, value: Any) -> str:
    """``value`` if it is safe as one path component, else :class:`~solvers.InvalidProblem`.

    Safe: the :data:`~pollux_opt.model.domains.NAME` pattern (letters, digits,
    '.', '_' and '-', starting with a letter or digit: no separator, never
    ``"."`` or ``".."``), at most :data:`MAX_NAME_CHARS` characters.

    Args:
        kind: what the name is, for the message (``"job id"``, ``"spec.name"``).
        value: the name.

    Raises:
        InvalidProblem: ``"{kind} must be letters, digits, ... , got '../victim'"``.
    """
    check(kind, value, NAME)
    if len(value) > MAX_NAME_CHARS:
        raise InvalidProblem(f"{kind} must be at most {MAX_NAME_CHARS} characters, got {len(value)}")
    return value


def _fsync_dir(directory: Path) -> None:
    """Flush ``directory``'s entries (the rename) to disk, where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory file descriptors
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - file systems that refuse to fsync a directory
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring); creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(
    path: str | os.PathLike, obj: Any, *, indent: int | None = 2, sort_keys: bool = False, allow_nan: bool = False
) -> None:
    """Write ``obj`` as JSON to ``path`` atomically.

    The defaults write strict JSON (``allow_nan=False``: a nan raises
    ``ValueError`` instead of writing a token other JSON readers reject; pass
    the object through :func:`pollux_opt.records.events.jsonable` first).
    """
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=allow_nan))


def atomic_write_csv(path: str | os.PathLike, frame: Any) -> None:
    """Write a pandas DataFrame ``frame`` to ``path`` atomically as CSV, without its index."""
    atomic_write_text(path, frame.to_csv(index=False))


def drop_torn_line(path: str | os.PathLike) -> bytes:
    """Truncate a torn last line of the line-per-write file ``path`` (a crash
    mid-append leaves one) and return its last complete line (``b""``: none).

    Append-only logs (a run's event log, a job's ``events.jsonl`` and
    ``steps.csv``) call it once before appending, so that a new line never
    continues a torn one.
    """
    path = Path(path)
    if not path.exists():
        return b""
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        log.warning("%s: dropping a torn last line (%d bytes)", path, len(data) - keep)
        with open(path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return data[data.rfind(b"\n", 0, max(keep - 1, 0)) + 1:keep]
