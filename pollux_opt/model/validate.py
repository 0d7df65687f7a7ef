"""Argument checks shared by the model's array functions.

Each check raises :class:`solvers.InvalidProblem` naming the argument and
its first offending entry, so a user sees which value to fix.
"""

from __future__ import annotations

import numpy as np

from solvers import InvalidProblem

__all__ = ["as_allocation", "as_count", "as_counts", "as_numeric", "broadcast_args", "first_bad"]


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
