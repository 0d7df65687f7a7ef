r"""Exact node-level MILP for the allocation problem (Pyomo model, solved by HiGHS).

Formulation (also in ``docs/formulation.md``).  Indices: jobs j, nodes n,
candidate configurations c (each belongs to one job j(c) and has N_c nodes,
K_c replicas and speedup s_c).  Pre-solve, configurations dominated by a
smaller one of the same job are dropped (see :func:`prune_dominated`).

Variables
    y[c]    in {0,1}   job j(c) runs in configuration c (and is moved/started);
    k[j]    in {0,1}   job j keeps its current placement unchanged (running jobs only);
    r[j,n]  in Z>=0    replicas of job j on node n;
    a[j,n]  in {0,1}   job j uses node n as a single-node job;
    b[j,n]  in {0,1}   job j uses node n as a multi-node job.

Constraints
    sum_c y[c] + k[j] <= 1                         one choice per job (none = 0 replicas)
    sum_n r[j,n] = sum_c K_c y[c] + K0_j k[j]      replicas match the choice
    sum_n a[j,n] = sum_{c:N_c=1} y[c] + [N0_j=1] k[j]
    sum_n b[j,n] = sum_{c:N_c>1} N_c y[c] + [N0_j>1] N0_j k[j]
    a[j,n] + b[j,n] <= r[j,n] <= cap_n (a[j,n] + b[j,n])   a used node holds >= 1 replica
    sum_j r[j,n] <= cap_n                         node capacity
    sum_j b[j,n] <= 1                             interference avoidance (if enabled)
    cur[j,n] k[j] <= r[j,n] <= cur[j,n] + cap_n (1 - k[j])   keeping means r = current

Objective.  The power mean ``M_p = (sum_j w_j (x_j + eps)^p / W)^(1/p)`` is a
monotone function of ``U = sum_j w_j u(x_j)`` with ``u`` from
:func:`solvers.utility`.  Because each job picks exactly one option, ``u`` of
its value is a constant per option, so ``U`` is *linear* in (y, k):

    max  sum_c w_j (u(s_c f_j) - u(0)) y[c] + sum_j w_j (u(s0_j) - u(0)) k[j] + sum_j w_j u(0)

with f_j the restart factor (1 for a job that holds nothing) and s0_j the
speedup of the current placement.  Choosing y for the current shape and
landing on the same nodes pays f_j needlessly; the k option dominates it, so
an optimal solution never does that, and the reported objective is always
recomputed from the decoded placement with :func:`solvers.evaluate`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from ._errors import InvalidProblem
from ._problem import Problem, evaluate, mean_from_utility_sum, utility, violations
from ._result import Result, Status

__all__ = ["solve_milp", "build_model", "prune_dominated", "HIGHS_STATUS"]

log = logging.getLogger(__name__)

#: Default relative MIP gap, as pinned by the allocation options (issue 2).
DEFAULT_MIP_GAP = 1e-4


def _highs_status_table() -> dict:
    """Map HiGHS model statuses to (has_solution -> Status, no_solution -> Status)."""
    import highspy

    ms = highspy.HighsModelStatus
    table = {
        ms.kOptimal: (Status.OPTIMAL, Status.ERROR),
        ms.kInfeasible: (Status.INFEASIBLE, Status.INFEASIBLE),
        ms.kUnboundedOrInfeasible: (Status.ERROR, Status.INFEASIBLE),
        ms.kTimeLimit: (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION),
        ms.kIterationLimit: (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION),
        ms.kInterrupt: (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION),
    }
    if hasattr(ms, "kSolutionLimit"):
        table[ms.kSolutionLimit] = (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION)
    return table


#: HiGHS model status -> (status when a feasible solution exists, status when not);
#: any status not listed maps to ``Status.ERROR``.  Built lazily (highspy import).
HIGHS_STATUS: dict = {}


def prune_dominated(problem: Problem) -> np.ndarray:
    """bool[C]: configurations that no optimal solution needs.

    Configuration (N, K) of a job is dominated by another of its configurations
    (N', K') with speedup ``s' >= s`` when every placement realising (N, K)
    contains a placement realising (N', K'): keep the N' nodes holding most
    replicas (together at least ``ceil(K N' / N)``) and drop replicas down to
    K'.  That holds when ``N' <= N`` and ``N' <= K' <= ceil(K N' / N)``; the
    sub-placement uses no more capacity, no more nodes, and is multi-node only
    if the original was.  Dropping dominated options keeps the optimum exact.
    """
    keep = np.ones(problem.num_configs, dtype=bool)
    starts = problem.cfg_start
    for j in range(problem.num_jobs):
        lo, hi = starts[j], starts[j + 1]
        if hi - lo < 2:
            continue
        nodes = problem.cfg_nodes[lo:hi]
        reps = problem.cfg_replicas[lo:hi]
        spd = problem.cfg_speedup[lo:hi]
        cap = -(-reps[:, None] * nodes[None, :] // nodes[:, None])  # ceil(K N' / N): [c, c']
        dominated_by = (
            (nodes[None, :] <= nodes[:, None])
            & (reps[None, :] <= cap)
            & (spd[None, :] >= spd[:, None])
            & ((nodes[None, :] < nodes[:, None]) | (reps[None, :] < reps[:, None]))
        )
        # Ties: keep the smaller configuration, drop the larger (strictly dominated by shape).
        keep[lo:hi] = ~dominated_by.any(axis=1)
    return keep


@dataclass(frozen=True)
class _Data:
    """Index sets and coefficients of the model, derived from a Problem by pure numpy."""

    single: np.ndarray  # int64[S] kept single-node configurations (N_c = 1)
    multi: np.ndarray  # int64[M] kept multi-node configurations (N_c > 1)
    keep_cfg: dict  # running job j -> (N0, K0, s0) when its current shape is allowed
    multi_jobs: np.ndarray  # int64[J_m] jobs with a multi-node configuration


def _derive(problem: Problem) -> _Data:
    keep = prune_dominated(problem)
    configs = np.flatnonzero(keep)
    table = problem.speedup_table
    a, r = problem.table_shape
    keep_cfg = {}
    for j in np.flatnonzero(problem.has_current):
        n0, k0 = int((problem.current[j] > 0).sum()), int(problem.current[j].sum())
        if n0 <= a and k0 <= r and not math.isnan(table[j, n0, k0]):
            keep_cfg[int(j)] = (n0, k0, float(table[j, n0, k0]))
    one_node = problem.cfg_nodes[configs] == 1
    multi = configs[~one_node]
    return _Data(
        single=configs[one_node],
        multi=multi,
        keep_cfg=keep_cfg,
        multi_jobs=np.unique(problem.cfg_job[multi]),
    )


def build_model(problem: Problem):
    """Build the Pyomo model of ``problem`` (pure: same problem, same model).

    Returns:
        (model, data): a ``pyomo.environ.ConcreteModel`` and the derived index
        data used to decode it.
    """
    import pyomo.environ as pyo

    d = _derive(problem)
    p = problem.p
    u0 = float(utility(0.0, p))
    cap = problem.capacity
    cur = problem.current
    w = problem.weight
    f = np.where(problem.has_current, problem.restart_factor, 1.0)
    J, K, N, S = problem.cfg_job, problem.cfg_replicas, problem.cfg_nodes, problem.cfg_speedup
    nodes = range(problem.num_nodes)

    m = pyo.ConcreteModel(name="pollux_allocation")
    m.SN = pyo.Set(
        initialize=[(c, n) for c in d.single.tolist() for n in nodes if K[c] <= cap[n]],
        dimen=2,
        ordered=True,
    )
    m.M = pyo.Set(initialize=d.multi.tolist(), ordered=True)
    m.MN = pyo.Set(initialize=[(j, n) for j in d.multi_jobs.tolist() for n in nodes], dimen=2, ordered=True)
    m.KEEP = pyo.Set(initialize=sorted(d.keep_cfg), ordered=True)

    m.z = pyo.Var(m.SN, domain=pyo.Binary)  # single-node config c on node n
    m.y = pyo.Var(m.M, domain=pyo.Binary)  # multi-node config c
    m.b = pyo.Var(m.MN, domain=pyo.Binary)  # multi-node job j uses node n
    m.q = pyo.Var(m.MN, domain=pyo.NonNegativeIntegers, bounds=lambda _, j, n: (0, int(cap[n])))
    m.k = pyo.Var(m.KEEP, domain=pyo.Binary)  # job j keeps its current placement

    z_of_job = {j: [] for j in range(problem.num_jobs)}
    z_on_node = {n: [] for n in nodes}
    for c, n in m.SN:
        z_of_job[int(J[c])].append((c, n))
        z_on_node[n].append((c, n))
    y_of_job = {j: [] for j in range(problem.num_jobs)}
    for c in m.M:
        y_of_job[int(J[c])].append(c)
    kept_on_node = {n: [j for j in d.keep_cfg if cur[j, n] > 0] for n in nodes}
    mjobs = d.multi_jobs.tolist()

    def one_choice(m, j):  # sum_{c,n} z[c,n] + sum_c y[c] + k[j] <= 1
        terms = [m.z[i] for i in z_of_job[j]] + [m.y[c] for c in y_of_job[j]]
        if j in d.keep_cfg:
            terms.append(m.k[j])
        if len(terms) < 2:
            return pyo.Constraint.Skip
        return sum(terms) <= 1

    def multi_replicas(m, j):  # sum_n q[j,n] = sum_c K_c y[c]
        return sum(m.q[j, n] for n in nodes) == sum(int(K[c]) * m.y[c] for c in y_of_job[j])

    def multi_nodes(m, j):  # sum_n b[j,n] = sum_c N_c y[c]
        return sum(m.b[j, n] for n in nodes) == sum(int(N[c]) * m.y[c] for c in y_of_job[j])

    def used_node_has_replica(m, j, n):  # b[j,n] <= q[j,n]
        return m.b[j, n] <= m.q[j, n]

    def replica_needs_node(m, j, n):  # q[j,n] <= cap_n b[j,n]
        return m.q[j, n] <= int(cap[n]) * m.b[j, n]

    def capacity(m, n):  # sum K_c z[c,n] + sum_j q[j,n] + sum_j cur[j,n] k[j] <= cap_n
        terms = [int(K[c]) * m.z[c, n] for c, _ in z_on_node[n]]
        terms += [m.q[j, n] for j in mjobs]
        terms += [int(cur[j, n]) * m.k[j] for j in kept_on_node[n]]
        if not terms:
            return pyo.Constraint.Skip
        return sum(terms) <= int(cap[n])

    def one_multi_node_job(m, n):  # sum_j b[j,n] + sum_{j kept multi-node on n} k[j] <= 1
        terms = [m.b[j, n] for j in mjobs]
        terms += [m.k[j] for j in kept_on_node[n] if d.keep_cfg[j][0] > 1]
        if len(terms) < 2 or not problem.interference_avoidance:
            return pyo.Constraint.Skip
        return sum(terms) <= 1

    m.one_choice = pyo.Constraint(range(problem.num_jobs), rule=one_choice)
    m.multi_replicas = pyo.Constraint(mjobs, rule=multi_replicas)
    m.multi_nodes = pyo.Constraint(mjobs, rule=multi_nodes)
    m.used_node_has_replica = pyo.Constraint(m.MN, rule=used_node_has_replica)
    m.replica_needs_node = pyo.Constraint(m.MN, rule=replica_needs_node)
    m.capacity = pyo.Constraint(nodes, rule=capacity)
    m.one_multi_node_job = pyo.Constraint(nodes, rule=one_multi_node_job)

    def gain(c):  # w_j (u(s_c f_j) - u(0)): utility gained by choosing configuration c
        j = J[c]
        return float(w[j] * (utility(S[c] * f[j], p) - u0))

    gain_keep = {j: float(w[j] * (utility(s0, p) - u0)) for j, (_, _, s0) in d.keep_cfg.items()}
    base = float(w.sum() * u0)

    def utility_sum(m):  # max U = sum_j w_j u(x_j), linear in the one-hot choices
        return (
            base
            + sum(gain(c) * m.z[c, n] for c, n in m.SN)
            + sum(gain(c) * m.y[c] for c in m.M)
            + sum(gain_keep[j] * m.k[j] for j in m.KEEP)
        )

    m.U = pyo.Objective(rule=utility_sum, sense=pyo.maximize)
    return m, d


def _compile(model):
    """Pyomo model -> (c, offset, A (csr), row_lower, row_upper, col_lower, col_upper, integrality, columns)."""
    from pyomo.common.enums import ObjectiveSense
    from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

    info = LinearStandardFormCompiler().write(model, mixed_form=True, set_sense=ObjectiveSense.maximize)
    ncol = len(info.columns)
    c = np.asarray(info.c.toarray()).reshape(-1)[:ncol] if ncol else np.zeros(0)
    offset = float(np.asarray(info.c_offset).reshape(-1)[0]) if len(info.c_offset) else 0.0
    rhs = np.asarray(info.rhs, dtype=np.float64)
    sense = np.array([mult for _, mult in info.rows], dtype=np.int64)
    inf = np.inf
    row_lower = np.where(sense <= 0, rhs, -inf)
    row_upper = np.where(sense >= 0, rhs, inf)
    col_lower = np.array([v.lb if v.lb is not None else -inf for v in info.columns], dtype=np.float64)
    col_upper = np.array([v.ub if v.ub is not None else inf for v in info.columns], dtype=np.float64)
    integrality = np.array([1 if v.is_integer() else 0 for v in info.columns], dtype=np.int32)
    return c, offset, info.A.tocsr(), row_lower, row_upper, col_lower, col_upper, integrality, info.columns


def _new_highs():
    """A ``highspy.Highs`` whose one-off start-up banner does not reach stdout.

    HiGHS prints its banner from C++ when the first instance is created; it
    would corrupt the JSON that ``pollux-opt allocate`` writes to stdout.
    """
    import highspy
    from pyomo.common.tee import capture_output

    with capture_output(capture_fd=True):
        return highspy.Highs()


#: HiGHS ``primal_solution_status`` value of a feasible primal solution (kSolutionStatusFeasible).
_PRIMAL_FEASIBLE = 2

#: Relative tolerance when checking HiGHS's primal against its reported objective.
_OBJECTIVE_RTOL = 1e-6


def _primal_matches_objective(h, c: np.ndarray, offset: float, info) -> bool:
    """True when ``c @ x + offset`` of HiGHS's primal equals its reported objective."""
    x = np.asarray(h.getSolution().col_value)
    value = float(c @ x + offset)
    reported = float(info.objective_function_value)
    return abs(value - reported) <= _OBJECTIVE_RTOL * max(1.0, abs(reported))


def _warm_start(problem: Problem, d: _Data) -> list[int]:
    """Running jobs to keep in the warm start (all whose shape is still allowed).

    Where two kept multi-node jobs share a node (possible only if interference
    avoidance was just switched on), later jobs are left out of the start.
    """
    kept, taken = [], np.zeros(problem.num_nodes, dtype=bool)
    for j, (n0, _, _) in d.keep_cfg.items():
        on = problem.current[j] > 0
        if n0 > 1 and problem.interference_avoidance:
            if np.any(taken[on]):
                continue
            taken[on] = True
        kept.append(j)
    return kept


def _decode(problem: Problem, model, d: _Data, value) -> np.ndarray:
    """int64[J, N] placement from the model's variable values (``value(var) -> float``)."""
    placement = np.zeros_like(problem.current)
    for c, n in model.SN:
        if value(model.z[c, n]) > 0.5:
            placement[problem.cfg_job[c], n] = problem.cfg_replicas[c]
    for j, n in model.MN:
        placement[j, n] += int(round(value(model.q[j, n])))
    for j in model.KEEP:
        if value(model.k[j]) > 0.5:
            placement[j] = problem.current[j]
    return placement


def solve_milp(
    problem: Problem,
    *,
    time_limit: float | None = None,
    mip_gap: float = DEFAULT_MIP_GAP,
    threads: int | None = None,
    verbose: bool = False,
    seed: int | None = None,
) -> Result:
    """Solve ``problem`` exactly with the node-level MILP (see module docstring).

    Args:
        problem: the allocation problem.
        time_limit: wall-clock seconds for HiGHS (None: no limit).  On expiry the
            best feasible placement is returned with ``Status.TIME_LIMIT``, or
            the current placement with ``Status.TIME_LIMIT_NO_SOLUTION``.
        mip_gap: relative MIP gap at which HiGHS stops and reports optimal.
        threads: HiGHS threads (None: HiGHS default).
        verbose: stream the HiGHS log to stdout.
        seed: HiGHS ``random_seed`` (None: HiGHS default).

    Returns:
        A :class:`Result`; ``objective`` is recomputed from the placement,
        ``bound`` is HiGHS's dual bound mapped back to the power-mean scale.
    """
    import highspy

    if time_limit is not None and not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise InvalidProblem(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if not (isinstance(mip_gap, (int, float)) and 0 <= mip_gap < 1):
        raise InvalidProblem(f"mip_gap must be in [0, 1), got {mip_gap!r}")
    if not HIGHS_STATUS:
        HIGHS_STATUS.update(_highs_status_table())

    t0 = time.perf_counter()
    model, d = build_model(problem)
    c, offset, A, rlo, rhi, clo, chi, integrality, columns = _compile(model)
    kept = _warm_start(problem, d)

    h = _new_highs()
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    if threads is not None:
        h.setOptionValue("threads", int(threads))
    if seed is not None:
        h.setOptionValue("random_seed", int(seed))
    lp = highspy.HighsLp()
    lp.num_col_ = len(columns)
    lp.num_row_ = A.shape[0]
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.offset_ = offset
    lp.col_cost_ = c
    lp.col_lower_ = clo
    lp.col_upper_ = chi
    lp.row_lower_ = rlo
    lp.row_upper_ = rhi
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(np.float64)
    lp.integrality_ = [highspy.HighsVarType(int(t)) for t in integrality]
    h.passModel(lp)
    sol = highspy.HighsSolution()
    sol.col_value = [1.0 if v.parent_component() is model.k and v.index() in kept else 0.0 for v in columns]
    sol.value_valid = True
    h.setSolution(sol)
    build_seconds = time.perf_counter() - t0

    t1 = time.perf_counter()
    h.run()
    info = h.getInfo()
    has_solution = info.primal_solution_status == _PRIMAL_FEASIBLE
    if has_solution and not _primal_matches_objective(h, c, offset, info):
        # HiGHS 1.16 can report the optimum of a presolved run yet hand back the
        # user's start as its primal solution; solving again without the start
        # returns the primal that goes with the reported objective.
        log.warning("HiGHS primal does not match its objective; re-solving without the warm start")
        h.clearSolver()
        h.setSolution(highspy.HighsSolution())
        h.run()
        info = h.getInfo()
        has_solution = info.primal_solution_status == _PRIMAL_FEASIBLE
    solve_seconds = time.perf_counter() - t1
    model_status = h.getModelStatus()
    status = HIGHS_STATUS.get(model_status, (Status.ERROR, Status.ERROR))[0 if has_solution else 1]
    message = h.modelStatusToString(model_status)

    placement = problem.current.copy()
    if has_solution:
        x = np.asarray(h.getSolution().col_value)
        pos = {id(v): i for i, v in enumerate(columns)}
        placement = _decode(problem, model, d, lambda v: x[pos[id(v)]] if id(v) in pos else 0.0)
        broken = violations(problem, placement)
        if broken:
            log.error("HiGHS returned an infeasible placement: %s", broken)
            status, message = Status.ERROR, "; ".join(broken)
            placement = problem.current.copy()
    objective = evaluate(problem, placement) if not violations(problem, placement) else float("nan")
    w_sum = float(problem.weight.sum())
    bound = float("nan")
    if has_solution or model_status == highspy.HighsModelStatus.kOptimal:
        raw = info.mip_dual_bound if info.mip_node_count >= 0 else info.objective_function_value
        if math.isfinite(raw):
            bound = max(mean_from_utility_sum(raw, w_sum, problem.p), objective)
    gap = (bound - objective) / abs(bound) if math.isfinite(bound) and bound != 0 else float("nan")
    return Result(
        placement=placement,
        status=status,
        objective=objective,
        bound=bound,
        gap=max(gap, 0.0) if math.isfinite(gap) else gap,
        build_seconds=build_seconds,
        solve_seconds=solve_seconds,
        solver="milp",
        message=message,
        stats={
            "num_configs": int(d.single.size + d.multi.size),
            "num_configs_pruned": int(problem.num_configs - d.single.size - d.multi.size),
            "num_columns": len(columns),
            "num_rows": int(A.shape[0]),
            "mip_nodes": int(info.mip_node_count),
        },
    )
