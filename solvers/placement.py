"""A placement's value and feasibility under a :class:`~solvers.problem.Problem` (re-exported there).

:func:`job_values` and :func:`evaluate` compute the pinned objective of
:mod:`solvers.problem`; :func:`violations` lists every constraint a
placement breaks.  With node types a job's speedup is looked up with the
type of its nodes, and a job on nodes of two types is infeasible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import InvalidProblem
from .objective import power_mean

if TYPE_CHECKING:
    from .problem import Problem

__all__ = ["evaluate", "job_values", "violations"]


def job_values(problem: Problem, placement: np.ndarray) -> np.ndarray:
    """float64[J] ``x_j = s_j f_j`` of a placement (restart factor applied on a move).

    Raises:
        InvalidProblem: if a job's (nodes, replicas) pair is not an allowed configuration.
    """
    x = np.asarray(placement, dtype=np.int64)
    reps = x.sum(axis=1)
    nodes = (x > 0).sum(axis=1)
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
    moved = problem.has_current & np.any(x != problem.current, axis=1)
    return s * np.where(moved, problem.restart_factor, 1.0)


def _types_of(problem: Problem, row: np.ndarray) -> list[int]:
    """Sorted distinct node types of the nodes a row int[N] uses."""
    return np.unique(problem.node_type[np.asarray(row) > 0]).tolist()


def evaluate(problem: Problem, placement: np.ndarray) -> float:
    """Pinned objective M_p of a placement matrix int[J, N] (see module docstring)."""
    return power_mean(job_values(problem, placement), problem.weight, problem.p)


def violations(problem: Problem, placement: np.ndarray) -> list[str]:
    """Every constraint a placement int[J, N] breaks, as messages (empty if feasible)."""
    x = np.asarray(placement)
    out: list[str] = []
    if x.shape != (problem.num_jobs, problem.num_nodes):
        return [f"placement shape {x.shape} != ({problem.num_jobs}, {problem.num_nodes})"]
    if np.any(x < 0):
        out.append("negative replica count")
    load = x.sum(axis=0)
    for n in np.flatnonzero(load > problem.capacity):
        out.append(f"node {n}: {load[n]} replicas > capacity {problem.capacity[n]}")
    reps = x.sum(axis=1)
    nodes = (x > 0).sum(axis=1)
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
    if problem.typed:
        mixed = problem.placement_types(x)[1]
        for j in np.flatnonzero(mixed):
            out.append(f"job {j}: spans nodes of several types {_types_of(problem, x[j])}")
    else:
        mixed = np.zeros(problem.num_jobs, dtype=bool)
    try:
        job_values(problem, np.where(mixed[:, None], 0, x))  # the other jobs' configurations are still checked
    except InvalidProblem as exc:
        out.append(str(exc))
    if problem.interference_avoidance:
        multi = nodes > 1
        shared = ((x > 0) & multi[:, None]).sum(axis=0)
        for n in np.flatnonzero(shared > 1):
            out.append(f"node {n}: hosts {shared[n]} multi-node jobs")
    return out
