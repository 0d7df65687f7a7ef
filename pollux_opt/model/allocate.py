"""``allocate()``: turn jobs and cluster into a :class:`solvers.Problem` (:func:`to_problem`), solve, decode."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

import solvers
from solvers import InvalidProblem, Problem

from pollux_opt.model.allocation import Allocation
from pollux_opt.model.batch import BatchChoice, BatchConfig
from pollux_opt.model.cluster import Cluster
from pollux_opt.model.goodput import GoodputModel
from pollux_opt.model.job import Job, restart_factor
from pollux_opt.model.options import Options

__all__ = ["allocate", "to_problem"]

log = logging.getLogger(__name__)

#: Options passed to a solver only when its signature accepts them.
_GENERIC_SOLVER_OPTIONS = ("time_limit", "mip_gap", "seed")


#: Speedup tables cached across rounds: a scheduler calls allocate() every
#: interval with mostly unchanged (frozen, hashable) goodput models, and
#: evaluating a model at every (nodes, replicas) pair dominates a round's cost.
_SPEEDUP_CACHE_SIZE = 4096


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _model_table(
    model: GoodputModel,
    pairs: tuple[tuple[int, int], ...],
    base: tuple[int, int],
    fixed_batch_size: int | None,
) -> tuple[dict[tuple[int, int], float], BatchChoice | None]:
    """Speedups and best batch configurations of a goodput model at the given pairs.

    Returns ``({pair: speedup}, choice)``: the speedups of the feasible
    (speedup > 0) pairs, and the model's :class:`BatchChoice` at ``pairs``
    (arrays in the order of ``pairs``; None when there are none).  The choice
    is kept so that decoding a placement (:func:`_batch_config`) reuses it
    instead of optimizing again; ``GoodputModel.optimize`` treats every pair
    independently, so it equals a one-pair call.
    """
    if not pairs:
        return {}, None
    # The base goes last in the same call (one vectorised search instead of two).
    nn = np.array([p[0] for p in pairs] + [base[0]])
    kk = np.array([p[1] for p in pairs] + [base[1]])
    choice = model.optimize(nn, kk, fixed_batch_size=fixed_batch_size)
    if not choice.feasible[-1]:
        model.speedup(nn, kk, base=base, fixed_batch_size=fixed_batch_size)  # raises its clear error
    spd = choice.goodput[:-1] / choice.goodput[-1]
    keep = np.flatnonzero(spd > 0)
    table = dict(zip([pairs[i] for i in keep], spd[keep].tolist()))
    return table, choice


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _pair_index(pairs: tuple[tuple[int, int], ...]) -> dict[tuple[int, int], int]:
    """{pair: position in pairs}; a scheduler uses few distinct pair lists, so this is shared."""
    return {p: i for i, p in enumerate(pairs)}


def _batch_config(job: Job, pairs: tuple[tuple[int, int], ...], pair: tuple[int, int]) -> BatchConfig | None:
    """The cached best configuration of ``job`` at ``pair`` (None if not a feasible cached pair)."""
    table, choice = _model_table(job.speedup, pairs, job.base, job.fixed_batch_size)
    if pair not in table:
        return None
    return choice.config(_pair_index(pairs)[pair])


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _model_speedups(
    model: GoodputModel,
    pairs: tuple[tuple[int, int], ...],
    base: tuple[int, int],
    fixed_batch_size: int | None,
    spread_penalty: float,
) -> dict[tuple[int, int], float]:
    """{pair: speedup} of a goodput model at the given pairs, dropping infeasible (0)
    pairs, each discounted by ``1 - spread_penalty (N - 1)``: among spreads the
    model cannot tell apart, fewer nodes win (cached with the table it comes from)."""
    table = _model_table(model, pairs, base, fixed_batch_size)[0]
    return {(nn, k): s * (1.0 - spread_penalty * (nn - 1)) for (nn, k), s in table.items()}


def _candidate_pairs(job: Job, caps_desc: np.ndarray, max_nodes: int) -> list[tuple[int, int]]:
    """(num_nodes, num_replicas) pairs a job may take on this cluster and options.

    A pair needs ``num_nodes <= min(max_nodes, #nodes)``, replicas within the
    job's range, and replicas that fit on the ``num_nodes`` largest nodes.
    """
    return list(_pairs(max(job.min_replicas, 1), job.max_replicas, tuple(int(c) for c in caps_desc), max_nodes))


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _pairs(lo: int, hi: int, caps_desc: tuple[int, ...], max_nodes: int) -> tuple[tuple[int, int], ...]:
    """The pairs of :func:`_candidate_pairs`, cached: a scheduler asks for the same few ranges every round."""
    top = np.cumsum(caps_desc)
    pairs = []
    for n in range(1, min(max_nodes, len(caps_desc)) + 1):
        for k in range(max(n, lo), min(hi, int(top[n - 1])) + 1):
            pairs.append((n, k))
    return tuple(pairs)


def _restart_delay(job: Job, options: Options) -> float:
    """The delta of ``job``'s restart factor: its own delay, else the options' one."""
    return options.restart_delay if job.restart_delay is None else job.restart_delay


def to_problem(cluster: Cluster, jobs: Sequence[Job], options: Options) -> Problem:
    """The array problem (see :class:`solvers.Problem`) of the cluster, jobs and options.

    Raises:
        InvalidProblem: duplicate job ids, a placement on an unknown node or over capacity.
    """
    node_index = {nid: i for i, nid in enumerate(cluster.node_ids)}
    caps = np.array([n.cpus for n in cluster.nodes], dtype=np.int64)
    caps_desc = np.sort(caps)[::-1]
    seen: set[str] = set()
    current = np.zeros((len(jobs), caps.size), dtype=np.int64)
    cfg_job: list[int] = []
    cfg_nodes: list[int] = []
    cfg_reps: list[int] = []
    cfg_spd: list[float] = []
    for j, job in enumerate(jobs):
        if job.id in seen:
            raise InvalidProblem(f"duplicate job id {job.id!r}")
        seen.add(job.id)
        for nid, k in job.placement.items():
            if nid not in node_index:
                raise InvalidProblem(f"job {job.id!r}: placement on unknown node {nid!r}")
            current[j, node_index[nid]] = k
        pairs = tuple(_candidate_pairs(job, caps_desc, options.max_nodes_per_job))
        if isinstance(job.speedup, GoodputModel):
            table = _model_speedups(job.speedup, pairs, job.base, job.fixed_batch_size, options.spread_penalty)
        else:
            allowed = set(pairs)
            table = {p: s for p, s in job.speedup.items() if p in allowed}
        for (nn, k), s in sorted(table.items()):
            cfg_job.append(j)
            cfg_nodes.append(nn)
            cfg_reps.append(k)
            cfg_spd.append(float(s))
    load = current.sum(axis=0)
    for i in np.flatnonzero(load > caps):
        raise InvalidProblem(
            f"placement over capacity on node {cluster.nodes[i].id!r}: {load[i]} replicas > {caps[i]} cpus"
        )
    return Problem(
        capacity=caps,
        cfg_job=np.array(cfg_job, dtype=np.int64),
        cfg_nodes=np.array(cfg_nodes, dtype=np.int64),
        cfg_replicas=np.array(cfg_reps, dtype=np.int64),
        cfg_speedup=np.array(cfg_spd, dtype=np.float64),
        current=current,
        restart_factor=np.array([restart_factor(j.age, j.restarts, _restart_delay(j, options)) for j in jobs]),
        weight=np.array([j.weight for j in jobs], dtype=np.float64),
        min_replicas=np.array([j.min_replicas for j in jobs], dtype=np.int64),
        max_replicas=np.array([j.max_replicas for j in jobs], dtype=np.int64),
        p=options.p,
        max_nodes_per_job=options.max_nodes_per_job,
        interference_avoidance=options.interference_avoidance,
    )


def _batch_configs(
    jobs: Sequence[Job], placement: np.ndarray, cluster: Cluster, options: Options
) -> dict[str, BatchConfig]:
    caps_desc = np.sort(np.array([n.cpus for n in cluster.nodes], dtype=np.int64))[::-1]
    out = {}
    for job, row in zip(jobs, placement):
        k = int(row.sum())
        if k == 0 or not isinstance(job.speedup, GoodputModel):
            continue
        pair = (int((row > 0).sum()), k)
        pairs = tuple(_candidate_pairs(job, caps_desc, options.max_nodes_per_job))
        cached = _batch_config(job, pairs, pair)
        if cached is not None:  # computed by to_problem (same model, pairs and base)
            out[job.id] = cached
            continue
        choice = job.speedup.optimize(int((row > 0).sum()), k, fixed_batch_size=job.fixed_batch_size)
        out[job.id] = choice.config()
    return out


def allocate(
    cluster: Cluster,
    jobs: Sequence[Job],
    options: Options | None = None,
    **overrides: Any,
) -> Allocation:
    """Allocate replicas to jobs, maximising the pinned power-mean objective.

    Args:
        cluster: the nodes and their capacities.
        jobs: the jobs (ids unique).
        options: allocation options (defaults: p=-1, restart delay 30 s,
            interference avoidance, 16 nodes per job, exact "milp" solver).
        **overrides: any :class:`Options` field by name, e.g. ``solver="greedy"``.

    Returns:
        An :class:`Allocation`; infeasibility and time limits are statuses, not errors.

    Raises:
        InvalidProblem: bad input, naming the field and its value.

    Example::

        >>> from pollux_opt import Cluster, Job, allocate
        >>> cluster = Cluster.uniform(2, 4)
        >>> job = Job("a", {(1, 1): 1.0, (1, 2): 1.8, (2, 2): 1.6}, max_replicas=2)
        >>> alloc = allocate(cluster, [job])
        >>> alloc.status.value, sum(alloc.placement["a"].values())
        ('optimal', 2)
    """
    if not isinstance(cluster, Cluster):
        raise InvalidProblem(f"cluster must be a Cluster, got {type(cluster).__name__}")
    opts = Options.from_mapping(overrides, base=options)
    if opts.solver not in solvers.SOLVERS:
        raise InvalidProblem(f"unknown solver {opts.solver!r}; choose one of {sorted(solvers.SOLVERS)}")
    jobs = list(jobs)
    for job in jobs:
        if not isinstance(job, Job):
            raise InvalidProblem(f"jobs must be Job objects, got {type(job).__name__}")
    problem = to_problem(cluster, jobs, opts)
    accepted = solvers.solver_options(opts.solver)
    kwargs = {
        k: getattr(opts, k)
        for k in _GENERIC_SOLVER_OPTIONS
        if k in accepted and getattr(opts, k) is not None
    }
    result = solvers.solve(problem, opts.solver, **kwargs)
    log.info(
        "allocate: %d jobs on %d nodes with %s -> %s, objective %.6g (build %.3fs, solve %.3fs)",
        len(jobs), len(cluster.nodes), opts.solver, result.status.value,
        result.objective, result.build_seconds, result.solve_seconds,
    )
    ids = cluster.node_ids
    placement = {
        job.id: {ids[n]: int(row[n]) for n in np.flatnonzero(row)}
        for job, row in zip(jobs, result.placement)
    }
    return Allocation(
        placement=placement,
        batch=_batch_configs(jobs, result.placement, cluster, opts),
        objective=result.objective,
        bound=result.bound,
        gap=result.gap,
        status=result.status,
        build_seconds=result.build_seconds,
        solve_seconds=result.solve_seconds,
        solver=result.solver,
    )
