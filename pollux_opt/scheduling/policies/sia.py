"""Sia: heterogeneity-aware, goodput-optimised scheduling (Jayaram Subramanya et al., SOSP 2023).

Each round, for every active job and every configuration of Sia's set
(:func:`~pollux_opt.model.configs.typed_configurations`:
powers of two inside a node, then whole nodes, per node type), the job's
goodput there (its model on that type: measured, or bootstrapped from another
type by the backend, :mod:`pollux_opt.model.projection`) is divided by the
smallest goodput of the job's row (*normalised goodput*, >= 1).  Every
configuration other than the job's current one is multiplied by Pollux's
restart factor with Sia's per-model restart estimate.  The integer program
then picks at most one configuration per job::

    minimise  sum_j sum_c w_j x_jc (A_jc + lambda_a [c != current_j])
              + lambda_n (J - sum_jc x_jc)                          (p < 0)
    subject to  sum_c x_jc <= 1                      for every job j
                sum_jc replicas_c x_jc [type_c = t] <= GPUs of type t   for every type t
                x_jc in {0, 1}

with ``A_jc = round(normalised goodput ** p, 2)`` (clipped at
:data:`~pollux_opt.scheduling.policies.sia_params.SIA_GOODPUT_CLIP`),
p = :data:`~pollux_opt.scheduling.policies.sia_params.SIA_P` and the
penalties of :mod:`~pollux_opt.scheduling.policies.sia_params`.  The
program counts GPUs per type only; the chosen configurations are then placed
on nodes (whole nodes for multi-node configurations, best fit for the rest),
keeping a job where it is when its configuration is unchanged.  Solved with
HiGHS through :func:`scipy.optimize.milp`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from solvers import Status

from pollux_opt.model import Cluster, restart_factor
from pollux_opt.model.configs import typed_configurations
from pollux_opt.model.domains import Boolean, Real, check_fields, domain_field
from pollux_opt.scheduling.loop import Decision, DecisionStatus, JobView
from pollux_opt.scheduling.policies.packing import pack_configurations
from pollux_opt.scheduling.policies.sia_params import (
    SIA_GOODPUT_CLIP,
    SIA_LAMBDA_CHANGE,
    SIA_LAMBDA_NO_ALLOC,
    SIA_P,
    SIA_ROUND_DECIMALS,
    SIA_ZERO_ALLOC_GAIN,
    sia_restart_penalty,
)
from pollux_opt.scheduling.policies.views import active_views, replica_cap

__all__ = ["SiaPolicy"]

log = logging.getLogger(__name__)

#: scipy's milp status codes (``OptimizeResult.status``) as solver statuses.
_STATUS = {0: Status.OPTIMAL, 1: Status.TIME_LIMIT, 2: Status.INFEASIBLE, 3: Status.ERROR, 4: Status.ERROR}


@dataclass
class SiaPolicy:
    """Sia's policy (see the module docstring).

    Attributes:
        p: fairness power of the normalised goodputs (< 0: minimised).
        lambda_no_alloc: cost of a job left without resources.
        lambda_change: cost added to every configuration other than a running job's current one.
        own_restart_delay: the restart factor uses each job's own restart delay
            (``view.restart_delay``) instead of Sia's per-model estimates.
        time_limit: seconds the integer program may take (None: none).
    """

    p: float = domain_field(SIA_P, Real(lt=0))
    lambda_no_alloc: float = domain_field(SIA_LAMBDA_NO_ALLOC, Real(ge=0))
    lambda_change: float = domain_field(SIA_LAMBDA_CHANGE, Real(ge=0))
    own_restart_delay: bool = domain_field(False, Boolean())
    time_limit: float | None = domain_field(None, Real(gt=0, unit="seconds", none=True))
    name: str = "sia"
    fixed_batch: bool = False

    def __post_init__(self) -> None:
        check_fields(self)

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        active = active_views(jobs, cluster)
        if not active:
            return Decision({}, math.nan, math.nan, DecisionStatus.IDLE)
        t0 = time.perf_counter()
        shapes = _type_shapes(cluster)
        configs = typed_configurations({t: (len(nodes), cap) for t, (nodes, cap) in shapes.items()})
        cost = np.array([self._costs(v, cluster, configs) for v in active])  # [J, C], inf: not allowed
        chosen, objective, status = self._solve(cost, configs, shapes, [v.weight for v in active])
        placement = _place(cluster, shapes, active, {v.job_id: c for v, c in zip(active, chosen)}, configs)
        return Decision(placement=placement, objective=objective, solver_seconds=math.nan,
                        status=status, allocator_seconds=time.perf_counter() - t0)

    # ------------------------------------------------------------------ rows
    def _costs(self, view: JobView, cluster: Cluster, configs) -> np.ndarray:
        """float64[C]: the job's ``A_jc`` (+ lambda_a off its current configuration); inf where not allowed."""
        cap = replica_cap(view, cluster)
        lo = max(view.min_replicas, 1)
        goodput = np.zeros(len(configs))
        for t in dict.fromkeys(c[0] for c in configs):
            idx = [i for i, c in enumerate(configs) if c[0] == t]
            nodes = np.array([configs[i][1] for i in idx])
            reps = np.array([configs[i][2] for i in idx])
            ok = (reps >= lo) & (reps <= cap)
            model = (view.goodput_models or {}).get(t, view.goodput_model)
            if model is None:  # never measured: linear in replicas (Pollux's optimistic prior)
                g = reps.astype(float)
            else:
                g = np.asarray(model.optimize(nodes, reps).goodput, dtype=float)
            goodput[idx] = np.where(ok, g, 0.0)
        valid = goodput > 0
        if not valid.any():
            return np.full(len(configs), np.inf)
        normalised = np.maximum(goodput / goodput[valid].min(), SIA_ZERO_ALLOC_GAIN)
        current = _current_config(view, cluster, configs)
        if current is not None:
            factor = self._restart_factor(view)
            keep = normalised[current]
            normalised = normalised * factor
            normalised[current] = keep
        with np.errstate(divide="ignore"):  # a restart factor of 0: infinite, then clipped as in the artifact
            powered = np.minimum(np.round(normalised**self.p, SIA_ROUND_DECIMALS), SIA_GOODPUT_CLIP)
        if current is not None:
            powered = powered + self.lambda_change * (np.arange(len(configs)) != current)
        return np.where(valid, powered, np.inf)

    def _restart_factor(self, view: JobView) -> float:
        """Pollux's restart factor with Sia's restart estimate; 1 for a job younger than it
        (artifact ``sia.py``: "don't penalize jobs that have not scaled up even once")."""
        delay = float(view.restart_delay) if self.own_restart_delay else sia_restart_penalty(view.job_id)
        return 1.0 if view.age < delay else restart_factor(view.age, view.restarts, delay)

    # ----------------------------------------------------------------- solve
    def _solve(self, cost: np.ndarray, configs, shapes, weights) -> tuple[list[int | None], float, Status]:
        """The configuration index per job (None: nothing), the objective and the status."""
        n_jobs, n_cfg = cost.shape
        allowed = np.isfinite(cost)
        w = np.asarray(weights, dtype=float)[:, None]
        c = np.where(allowed, w * cost - self.lambda_no_alloc, 0.0).ravel()
        one = np.kron(np.eye(n_jobs), np.ones(n_cfg))                        # sum_c x_jc <= 1
        types = list(shapes)
        per_type = np.zeros((len(types), n_cfg))
        for i, (t, _, k) in enumerate(configs):
            per_type[types.index(t), i] = k
        gpus = np.tile(per_type, (1, n_jobs))                                 # sum_jc k_c x_jc <= GPUs of t
        limits = [len(shapes[t][0]) * shapes[t][1] for t in types]
        options = {} if self.time_limit is None else {"time_limit": self.time_limit}
        res = milp(c, integrality=np.ones(c.size), bounds=Bounds(0, allowed.ravel().astype(float)),
                   constraints=[LinearConstraint(one, 0, 1), LinearConstraint(gpus, 0, limits)], options=options)
        status = _STATUS.get(res.status, Status.ERROR)
        if res.x is None:
            log.warning("sia: integer program found no solution (%s); every job gets nothing", res.message)
            return [None] * n_jobs, math.nan, status
        x = np.round(res.x).reshape(n_jobs, n_cfg) > 0.5
        chosen = [int(np.flatnonzero(row)[0]) if row.any() else None for row in x]
        return chosen, float(res.fun + self.lambda_no_alloc * n_jobs), status


def _type_shapes(cluster: Cluster) -> dict[str, tuple[list[str], int]]:
    """``{type: (node ids, replicas per node)}``; a type's node size is its largest node's."""
    return {t: ([n.id for n in cluster.of_type(t)], max(n.cpus for n in cluster.of_type(t))) for t in cluster.types}


def _current_config(view: JobView, cluster: Cluster, configs) -> int | None:
    """Index of the job's current (type, nodes, replicas) in ``configs``, if it is one."""
    if not view.placement:
        return None
    types = {n.id: n.type for n in cluster.nodes}
    kinds = {types[nid] for nid in view.placement}
    if len(kinds) != 1:
        return None
    key = (kinds.pop(), len(view.placement), sum(view.placement.values()))
    return configs.index(key) if key in configs else None


def _place(cluster: Cluster, shapes, active: Sequence[JobView], chosen: dict, configs) -> dict[str, dict[str, int]]:
    """Node placements of the chosen configurations, type by type; a job whose
    configuration is unchanged keeps its nodes when the rest still fit."""
    out: dict[str, dict[str, int]] = {v.job_id: {} for v in active}
    by_id = {v.job_id: v for v in active}
    for t, (nodes, size) in shapes.items():
        wanted = {j: configs[c][1:] for j, c in chosen.items() if c is not None and configs[c][0] == t}
        keep = {j for j in wanted
                if by_id[j].placement and _current_config(by_id[j], cluster, configs) == chosen[j]}
        placed = pack_configurations(cluster, nodes, wanted, {j: by_id[j].placement for j in keep})
        if placed is None:
            placed = pack_configurations(cluster, nodes, wanted, {}, strict=False)
        out.update(placed)
    return out



