"""``allocate()``: turn jobs and cluster into a :class:`solvers.Problem` (:func:`to_problem`), solve, decode."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from itertools import accumulate
from typing import Any, Sequence

import numpy as np

import solvers
from solvers import InvalidProblem, Problem, Status

from pollux_opt.model.allocation import Allocation
from pollux_opt.model.batch import BatchChoice, BatchConfig
from pollux_opt.model.cluster import Cluster
from pollux_opt.model.domains import shown
from pollux_opt.model.goodput import GoodputModel
from pollux_opt.model.job import Job, restart_factor
from pollux_opt.model.options import Options
from pollux_opt.model.validate import OutOfTime, check_deadline

__all__ = ["allocate", "to_problem"]

log = logging.getLogger(__name__)

#: Seconds per job of decoding a solver's answer (placements and batch
#: configurations): 1.3 s for 200,000 jobs on the project's 2-core machine at
#: load 1, doubled.  Kept back from the solver's time limit.
DECODE_SECONDS_PER_JOB = 1.3e-5
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


def _discounted(table: dict[tuple[int, int], float], spread_penalty: float) -> dict[tuple[int, int], float]:
    """``table``'s speedups, each discounted by ``1 - spread_penalty (N - 1)``: among
    spreads a goodput model cannot tell apart, fewer nodes win."""
    return {(nn, k): s * (1.0 - spread_penalty * (nn - 1)) for (nn, k), s in table.items()}


def _top_sums(cluster: Cluster) -> tuple[int, ...]:
    """``top[n - 1]``: the capacity of the cluster's ``n`` largest nodes together."""
    return tuple(accumulate(sorted((n.cpus for n in cluster.nodes), reverse=True)))


def _replica_range(job: Job, top: tuple[int, ...], max_nodes: int) -> tuple[int, int, int]:
    """``(lo, hi, nodes)``: the replica counts and the node count a job may take
    (``top`` from :func:`_top_sums`).

    The upper end is what the job can use, never a node's size: its
    ``max_replicas``, the cluster's largest ``nodes`` nodes together, and for
    a goodput model the largest replica count with a batch: choosing its own
    batch size, ``max_batch_size // min_local_bsz`` (beyond it every
    configuration is infeasible); at a fixed batch size B, B replicas (beyond,
    a replica would hold no sample of the batch).
    """
    nodes = min(max_nodes, len(top))
    hi = min(job.max_replicas, top[nodes - 1])
    if isinstance(job.speedup, GoodputModel):
        limits = job.speedup.limits
        usable = limits.max_batch_size // limits.min_local_bsz if job.fixed_batch_size is None else job.fixed_batch_size
        hi = min(hi, usable)
    return max(job.min_replicas, 1), hi, min(nodes, max(hi, 0))


def _candidate_pairs(job: Job, top: tuple[int, ...], max_nodes: int) -> tuple[tuple[int, int], ...]:
    """(num_nodes, num_replicas) pairs a goodput-model job may take on this cluster and options.

    A pair needs ``num_nodes <= min(max_nodes, #nodes)``, replicas within the
    job's usable range (:func:`_replica_range`), and replicas that fit on the
    ``num_nodes`` largest nodes.
    """
    lo, hi, nodes = _replica_range(job, top, max_nodes)
    return _pairs(lo, hi, top[:nodes])


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _pairs(lo: int, hi: int, top: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The pairs of :func:`_candidate_pairs` on nodes of capacity sums ``top``, cached:
    a scheduler asks for the same few ranges every round."""
    return tuple((n, k) for n in range(1, len(top) + 1) for k in range(max(n, lo), min(hi, top[n - 1]) + 1))


def _placeable_table(job: Job, top: tuple[int, ...], max_nodes: int) -> dict[tuple[int, int], float]:
    """The pairs of an explicit speedup table the job may take (as :func:`_candidate_pairs`
    enumerates them), found by checking the table's own pairs: the cost grows with the
    table, not with the cluster."""
    lo, hi, nodes = _replica_range(job, top, max_nodes)
    return {
        (nn, k): s for (nn, k), s in job.speedup.items() if nn <= nodes and max(nn, lo) <= k <= min(hi, top[nn - 1])
    }


def _table_configs(table: dict[tuple[int, int], float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nodes int64[C], replicas int64[C], speedup float64[C]) of a speedup table, in (nodes, replicas) order."""
    items = sorted(table.items())
    return (
        np.array([nn for (nn, _), _ in items], dtype=np.int64),
        np.array([k for (_, k), _ in items], dtype=np.int64),
        np.array([float(s) for _, s in items], dtype=np.float64),
    )


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _model_configs(
    model: GoodputModel,
    pairs: tuple[tuple[int, int], ...],
    base: tuple[int, int],
    fixed_batch_size: int | None,
    spread_penalty: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_table_configs` of a goodput model's discounted speedup table (read-only arrays), cached:
    a scheduler's rounds encode mostly unchanged models."""
    table = _discounted(_model_table(model, pairs, base, fixed_batch_size)[0], spread_penalty)
    configs = _table_configs(table)
    for a in configs:
        a.flags.writeable = False
    return configs


def _joined(parts: list[np.ndarray], dtype) -> np.ndarray:
    """The arrays of ``parts`` end to end, as a new ``dtype`` array."""
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def _restart_delay(job: Job, options: Options) -> float:
    """The delta of ``job``'s restart factor: its own delay, else the options' one."""
    return options.restart_delay if job.restart_delay is None else job.restart_delay


def to_problem(cluster: Cluster, jobs: Sequence[Job], options: Options, *, deadline: float | None = None) -> Problem:
    """The array problem (see :class:`solvers.Problem`) of the cluster, jobs and options.

    ``deadline`` (``time.monotonic()`` seconds, optional) bounds the encoding.

    Raises:
        InvalidProblem: duplicate job ids, a placement on an unknown node or over capacity.
        OutOfTime: (an :class:`InvalidProblem`) ``deadline`` passed.
    """
    node_index = {nid: i for i, nid in enumerate(cluster.node_ids)}
    caps = np.array([n.cpus for n in cluster.nodes], dtype=np.int64)
    top = _top_sums(cluster)
    seen: set[str] = set()
    current = np.zeros((len(jobs), caps.size), dtype=np.int64)
    cfg_job: list[np.ndarray] = []
    cfg_nodes: list[np.ndarray] = []
    cfg_reps: list[np.ndarray] = []
    cfg_spd: list[np.ndarray] = []
    for j, job in enumerate(jobs):
        check_deadline(deadline, j, len(jobs), "encoding")
        if job.id in seen:
            raise InvalidProblem(f"duplicate job id {job.id!r}")
        seen.add(job.id)
        for nid, k in job.placement.items():
            if nid not in node_index:
                raise InvalidProblem(f"job {job.id!r}: placement on unknown node {nid!r}")
            current[j, node_index[nid]] = k
        if isinstance(job.speedup, GoodputModel):
            pairs = _candidate_pairs(job, top, options.max_nodes_per_job)
            configs = _model_configs(job.speedup, pairs, job.base, job.fixed_batch_size, options.spread_penalty)
        else:
            configs = _table_configs(_placeable_table(job, top, options.max_nodes_per_job))
        cfg_job.append(np.full(configs[0].size, j, dtype=np.int64))
        cfg_nodes.append(configs[0])
        cfg_reps.append(configs[1])
        cfg_spd.append(configs[2])
    load = current.sum(axis=0)
    for i in np.flatnonzero(load > caps):
        raise InvalidProblem(
            f"placement over capacity on node {cluster.nodes[i].id!r}: {load[i]} replicas > {caps[i]} cpus"
        )
    return Problem(
        capacity=caps,
        cfg_job=_joined(cfg_job, np.int64),
        cfg_nodes=_joined(cfg_nodes, np.int64),
        cfg_replicas=_joined(cfg_reps, np.int64),
        cfg_speedup=_joined(cfg_spd, np.float64),
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
    top = _top_sums(cluster)
    out = {}
    for job, row in zip(jobs, placement):
        k = int(row.sum())
        if k == 0 or not isinstance(job.speedup, GoodputModel):
            continue
        pair = (int((row > 0).sum()), k)
        pairs = _candidate_pairs(job, top, options.max_nodes_per_job)
        cached = _batch_config(job, pairs, pair)
        if cached is not None:  # computed by to_problem (same model, pairs and base)
            out[job.id] = cached
            continue
        choice = job.speedup.optimize(int((row > 0).sum()), k, fixed_batch_size=job.fixed_batch_size)
        out[job.id] = choice.config()
    return out


def _checked_arguments(
    cluster: Any, jobs: Any, options: Any, overrides: dict[str, Any]
) -> tuple[Options, list[Job]]:
    """The options and the list of jobs of :func:`allocate`'s arguments, or :class:`InvalidProblem`."""
    if not isinstance(cluster, Cluster):
        raise InvalidProblem(f"cluster must be a Cluster, got {shown(cluster)}")
    if options is not None and not isinstance(options, Options):
        raise InvalidProblem(
            f"options must be an Options or None (pass single options as keywords, e.g. p=0), got {shown(options)}"
        )
    opts = Options.from_mapping(overrides, base=options)
    if opts.solver not in solvers.SOLVERS:
        raise InvalidProblem(f"unknown solver {opts.solver!r}; choose one of {sorted(solvers.SOLVERS)}")
    if isinstance(jobs, (str, bytes, Mapping, Job)) or not isinstance(jobs, Iterable):
        raise InvalidProblem(f"jobs must be a sequence of Job objects, got {shown(jobs)}")
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise InvalidProblem(f"jobs[{i}] must be a Job, got {shown(job)}")
    return opts, jobs


def _unsolved(jobs: Sequence[Job], options: Options, seconds: float) -> Allocation:
    """The answer of a call that ran out of time before solving: every job as placed now."""
    nan = float("nan")
    return Allocation(
        placement={job.id: dict(job.placement) for job in jobs}, batch={}, objective=nan, bound=nan, gap=nan,
        status=Status.TIME_LIMIT_NO_SOLUTION, build_seconds=seconds, solve_seconds=0.0, solver=options.solver,
    )


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
        ``time_limit`` bounds the whole call: the solver gets what encoding
        left, and an encoding that takes it all returns every job's current
        placement with status ``time_limit_no_solution`` (objective nan).

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
    start = time.monotonic()
    opts, jobs = _checked_arguments(cluster, jobs, options, overrides)
    deadline = None if opts.time_limit is None or math.isinf(opts.time_limit) else start + opts.time_limit
    log.info("allocate: encoding %d jobs on %d nodes", len(jobs), len(cluster.nodes))
    try:
        problem = to_problem(cluster, jobs, opts, deadline=deadline)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise OutOfTime(f"encoding took the whole time limit of {opts.time_limit:g} s")
    except OutOfTime as exc:
        log.warning("allocate: %s; every job keeps its current placement (%s)",
                    exc, Status.TIME_LIMIT_NO_SOLUTION.value)
        return _unsolved(jobs, opts, time.monotonic() - start)
    accepted = solvers.solver_options(opts.solver)
    kwargs = {
        k: getattr(opts, k)
        for k in _GENERIC_SOLVER_OPTIONS
        if k in accepted and getattr(opts, k) is not None
    }
    if "time_limit" in kwargs and left is not None:
        # The limit covers the whole call: encoding before the solve, decoding after it.
        kwargs["time_limit"] = left - min(DECODE_SECONDS_PER_JOB * len(jobs), left / 2)
    log.info("allocate: solving %d configurations with %s%s", problem.cfg_job.size, opts.solver,
             "" if left is None else f" ({left:.3g} s of the time limit left)")
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
