"""Argument checks shared by the model's array functions.

Each check raises :class:`solvers.InvalidProblem` naming the argument and
its first offending entry, so a user sees which value to fix.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from solvers import InvalidProblem, OutOfTime

__all__ = [
    "DEADLINE_EVERY",
    "as_allocation",
    "as_count",
    "as_counts",
    "as_numeric",
    "broadcast_args",
    "check_deadline",
    "first_bad",
    "read_json",
    "read_utf8",
]

#: How often (in items: jobs) a long loop looks at its deadline: a clock read
#: per item would cost more than the check it guards.
DEADLINE_EVERY = 1000


def read_utf8(path: str | os.PathLike, what: str) -> str:
    """The text of the file ``path``, which must be UTF-8 (a byte-order mark is
    allowed); ``what`` names the file in messages ("instance file").

    Raises:
        InvalidProblem: unreadable, or not UTF-8 (naming the first bad byte and its offset).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InvalidProblem(f"cannot read {what} {str(p)!r}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidProblem(
            f"{what} {str(p)!r} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        ) from None


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The decoded JSON value of the UTF-8 file ``path`` (see :func:`read_utf8`).

    Python's ``Infinity`` and ``NaN`` literals are read (a field's domain
    rejects them where they do not belong).

    Raises:
        InvalidProblem: naming the file: unreadable, not UTF-8, malformed JSON
            (with line and column), nested deeper than the parser's recursion
            limit, or an integer literal longer than Python converts
            (``sys.get_int_max_str_digits()``).
    """
    text = read_utf8(path, what)
    where = repr(str(Path(path)))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidProblem(f"malformed JSON in {where}: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise InvalidProblem(f"malformed JSON in {where}: nested too deeply") from None
    except ValueError as exc:  # an integer literal past int's digit limit
        raise InvalidProblem(f"malformed JSON in {where}: {exc}") from None


def check_deadline(deadline: float | None, i: int, total: int, what: str) -> None:
    """Raise :class:`OutOfTime` when ``deadline`` (``time.monotonic()`` seconds;
    None: none) has passed, looking at the clock every :data:`DEADLINE_EVERY`
    items; ``what`` names the step, ``i`` of ``total`` its progress."""
    if deadline is not None and i % DEADLINE_EVERY == 0 and time.monotonic() > deadline:
        raise OutOfTime(f"{what} ran past the time limit after {i} of {total} jobs")


def first_bad(arr: np.ndarray, bad: np.ndarray) -> str:
    """Describe the first offending entry of ``arr`` where ``bad`` (same shape) holds."""
    flat = np.flatnonzero(bad)
    value = arr.reshape(-1)[flat[0]].item()
    if arr.ndim == 0:
        return f"{value!r}"
    index = np.unravel_index(flat[0], arr.shape)
    return f"{value!r} at index {index if len(index) > 1 else index[0]}"


def as_numeric(name: str, value) -> np.ndarray:
    """``value`` as an integer or float array; raises unless it is numeric (bool is not)."""
    arr = np.asarray(value)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise InvalidProblem(f"{name} must be numeric, got {value!r}")
    return arr


def as_counts(name: str, value, minimum: int) -> np.ndarray:
    """int64 array of ``value``; raises unless every entry is an integer >= ``minimum``."""
    arr = as_numeric(name, value)
    as_float = arr.astype(np.float64)
    bad = ~np.isfinite(as_float) | (as_float < minimum) | (as_float != np.round(as_float))
    if bad.any():
        raise InvalidProblem(f"{name} must be an integer >= {minimum}, got {first_bad(arr, bad)}")
    return arr.astype(np.int64)


def as_count(name: str, value, minimum: int) -> int:
    """``value`` as a scalar integer >= ``minimum``."""
    arr = as_counts(name, value, minimum)
    if arr.ndim != 0:
        raise InvalidProblem(f"{name} must be a scalar integer, got shape {arr.shape}")
    return int(arr)


def as_allocation(num_nodes, num_replicas) -> tuple[np.ndarray, np.ndarray]:
    """Broadcast int64 (nodes, replicas) with ``1 <= nodes <= replicas``."""
    nodes = as_counts("num_nodes", num_nodes, 1)
    replicas = as_counts("num_replicas", num_replicas, 1)
    try:
        nodes, replicas = np.broadcast_arrays(nodes, replicas)
    except ValueError:
        raise InvalidProblem(
            f"num_nodes (shape {nodes.shape}) and num_replicas (shape {replicas.shape}) "
            "do not broadcast"
        ) from None
    bad = replicas < nodes
    if bad.any():
        raise InvalidProblem(
            "num_replicas must be >= num_nodes (at least one replica per node), got "
            f"num_replicas={first_bad(replicas, bad)} with num_nodes={nodes[bad].reshape(-1)[0]}"
        )
    return nodes, replicas


def broadcast_args(**arrays: np.ndarray) -> list[np.ndarray]:
    """The arrays broadcast together; raises naming every shape when they do not broadcast."""
    try:
        return list(np.broadcast_arrays(*arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items())
        raise InvalidProblem(f"argument shapes do not broadcast: {shapes}") from None
