"""A placement's value and feasibility under a :class:`~solvers.problem.Problem`.

:func:`job_values` and :func:`evaluate` compute the pinned objective of
:mod:`solvers.problem`; :func:`violations` lists every constraint a
placement breaks.  With node types a job's speedup is looked up with the
type of its nodes, and a job on nodes of two types is infeasible.
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidProblem
from .objective import power_mean
from .problem import Problem

__all__ = ["evaluate", "job_values", "violations", "violations_and_values"]


def job_values(problem: Problem, placement: np.ndarray) -> np.ndarray:
    """float64[J] ``x_j = s_j f_j`` of a placement (restart factor applied on a move).

    Raises:
        InvalidProblem: if a job's (nodes, replicas) pair is not an allowed configuration.
    """
    x = np.asarray(placement, dtype=np.int64)
    return _job_values(problem, x, x.sum(axis=1), (x > 0).sum(axis=1))


def _job_values(problem: Problem, x: np.ndarray, reps: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """:func:`job_values` of ``x`` int64[J, N] whose row sums and used-node counts are ``reps`` and ``nodes``."""
    kind = None
    if problem.typed:
        kind, mixed = problem.placement_types(x)
        bad = np.flatnonzero(mixed)
        if bad.size:
            j = bad[0]
            raise InvalidProblem(f"job {j} is placed on nodes of several types {_types_of(problem, x[j])}")
    s = problem.lookup_speedup(np.arange(problem.num_jobs), nodes, reps, kind)
    s[reps == 0] = 0.0
    bad = np.flatnonzero(np.isnan(s))
    if bad.size:
        j = bad[0]
        typed = "" if kind is None else f"type={kind[j]}, "
        raise InvalidProblem(
            f"job {j} is placed on ({typed}nodes={nodes[j]}, replicas={reps[j]}), "
            "which is not one of its allowed configurations"
        )
    running = np.flatnonzero(problem.has_current)  # only a job that holds replicas can move
    moved = np.zeros(problem.num_jobs, dtype=bool)
    moved[running] = np.any(x[running] != problem.current[running], axis=1)
    return s * np.where(moved, problem.restart_factor, 1.0)


def _types_of(problem: Problem, row: np.ndarray) -> list[int]:
    """Sorted distinct node types of the nodes a row int[N] uses."""
    return np.unique(problem.node_type[np.asarray(row) > 0]).tolist()


def evaluate(problem: Problem, placement: np.ndarray) -> float:
    """Pinned objective M_p of a placement matrix int[J, N] (see module docstring)."""
    return power_mean(job_values(problem, placement), problem.weight, problem.p)


def violations(problem: Problem, placement: np.ndarray) -> list[str]:
    """Every constraint a placement int[J, N] breaks, as messages (empty if feasible)."""
    return violations_and_values(problem, placement)[0]


def violations_and_values(problem: Problem, placement: np.ndarray) -> tuple[list[str], np.ndarray | None]:
    """(:func:`violations`, :func:`job_values`) of a placement int[J, N], the values None unless it is feasible.

    One pass over the placement for both, for callers that check a placement and then price it.
    """
    x = np.asarray(placement)
    out: list[str] = []
    if x.shape != (problem.num_jobs, problem.num_nodes):
        return [f"placement shape {x.shape} != ({problem.num_jobs}, {problem.num_nodes})"], None
    if np.any(x < 0):
        out.append("negative replica count")
    load = x.sum(axis=0)
    for n in np.flatnonzero(load > problem.capacity):
        out.append(f"node {n}: {load[n]} replicas > capacity {problem.capacity[n]}")
    reps = x.sum(axis=1)
    used = x > 0
    nodes = used.sum(axis=1)
    out_of_range = (reps > 0) & ((reps < problem.min_replicas) | (reps > problem.max_replicas))
    too_wide = (reps > 0) & (nodes > problem.max_nodes_per_job)
    for j in np.flatnonzero(out_of_range | too_wide):  # vectorised test, messages in job order
        if out_of_range[j]:
            out.append(
                f"job {j}: {reps[j]} replicas outside [{problem.min_replicas[j]}, "
                f"{problem.max_replicas[j]}]"
            )
        if too_wide[j]:
            out.append(f"job {j}: spans {nodes[j]} nodes > {problem.max_nodes_per_job}")
    x64 = x.astype(np.int64, copy=False)
    checked, checked_reps, checked_nodes = x64, reps, nodes
    if x.dtype != np.int64:  # the values are those of the placement as int64
        checked_reps, checked_nodes = x64.sum(axis=1), (x64 > 0).sum(axis=1)
    if problem.typed:
        mixed = problem.placement_types(x)[1]
        for j in np.flatnonzero(mixed):
            out.append(f"job {j}: spans nodes of several types {_types_of(problem, x[j])}")
        if mixed.any():  # the other jobs' configurations are still checked
            checked = np.where(mixed[:, None], 0, x64)
            checked_reps, checked_nodes = checked.sum(axis=1), (checked > 0).sum(axis=1)
    values = None
    try:
        values = _job_values(problem, checked, checked_reps, checked_nodes)
    except InvalidProblem as exc:
        out.append(str(exc))
    if problem.interference_avoidance:
        multi = nodes > 1
        shared = (used & multi[:, None]).sum(axis=0)
        for n in np.flatnonzero(shared > 1):
            out.append(f"node {n}: hosts {shared[n]} multi-node jobs")
    return out, (None if out else values)
