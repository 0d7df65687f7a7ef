"""The "milp" solver: the stages of :mod:`solvers.milp` run in rounds by one formulation.

Solve.  (1) :func:`~solvers.milp.bound.relax` prices CPUs (and multi-node
slots) in the aggregated relaxation: a Lagrangian bound L >= optimum and a
reduced cost rc_o per option, any placement using o being worth at most
L - rc_o.  (2) The formulation (:mod:`solvers.milp.strategy`) offers a set
of options; a placement worth more than L - min_{o not offered} rc_o uses
offered options only, so if a round's best placement reaches that value it
is optimal, and otherwise the formulation may widen the offer for another
round.  (3) Each round builds the model over the offered options, solves
its LP relaxation first and runs the MIP only if it is fractional,
warm-started from the current placement (a later round from the best one
so far).  (4) HiGHS statuses map to :class:`solvers.Status` through
:data:`~solvers.milp.highs.HIGHS_STATUS`.  The objective reported is
recomputed from the placement with :func:`solvers.evaluate`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from ..problem import Problem, evaluate, job_values, mean_from_utility_sum, utility, violations
from ..result import Result, Status
from .bound import Relaxation, relax
from .highs import MIN_TIME_LIMIT, HighsRun, load_status_table, new_highs, result_status, run_highs, stopped_early
from .model import pyomo_model, standard_form
from .options import DEFAULT_MIP_GAP, UTILITY_RTOL, OptionTable, check_options, option_table
from .packing import PackingGraph, packing_graph
from .strategy import Formulation, choose_formulation
from .warmstart import decode_placement, start_placement, warm_start_values

__all__ = ["solve_milp", "utility_sum"]

log = logging.getLogger(__name__)


def solve_milp(
    problem: Problem,
    *,
    time_limit: float | None = None,
    mip_gap: float = DEFAULT_MIP_GAP,
    formulation: str = "auto",
    threads: int | None = None,
    verbose: bool = False,
    seed: int | None = None,
) -> Result:
    """Solve ``problem`` with the arc-flow MILP (see the module docstring).

    Args:
        problem: the allocation problem.
        time_limit: wall-clock seconds for the whole solve, build included
            (None: no limit).  On expiry the best feasible placement is
            returned with ``Status.TIME_LIMIT``, or the current placement with
            ``Status.TIME_LIMIT_NO_SOLUTION``.
        mip_gap: relative gap (on the utility sum) at which a solve stops.
        formulation: ``"exact"``, ``"large"``
            (:class:`~solvers.milp.strategy.RestrictedFormulation`: each job
            restricted to its few best options by reduced cost; a feasible
            answer with an honest bound, ``Status.FEASIBLE`` unless the bound
            proves it within ``mip_gap``), or ``"auto"``: large from
            ``AUTO_LARGE_CPUS`` CPUs on, exact below.
        threads: HiGHS threads (None: HiGHS default).
        verbose: stream the HiGHS log to stdout.
        seed: HiGHS ``random_seed`` (None: HiGHS default).

    Returns:
        A :class:`Result`; ``objective`` is recomputed from the placement and
        ``bound`` is a proven upper bound on the optimum, both on the
        power-mean scale.  ``stats["formulation"]`` names the formulation used.

    Raises:
        InvalidProblem: if ``problem`` is not a :class:`Problem`, ``time_limit``
            is not a positive number, ``mip_gap`` is outside [0, 1) or
            ``formulation`` is unknown.
    """
    check_options(problem, time_limit, mip_gap, formulation)
    load_status_table()
    import highspy  # noqa: F401
    import pyomo.environ  # noqa: F401  (one-off import cost stays out of build_seconds)

    new_highs()  # the one-off HiGHS banner, too
    chosen = choose_formulation(problem, formulation)
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    table = option_table(problem)
    rel = relax(problem, table)
    highs_options = {"mip_gap": mip_gap, "threads": threads, "verbose": verbose, "seed": seed}
    rounds = _solve_rounds(problem, chosen, table, rel, t0, deadline, highs_options)
    status = _status(rounds, rel, mip_gap)
    return _result(problem, chosen, table, rel, rounds, status)


def utility_sum(problem: Problem, placement: np.ndarray) -> float:
    """``sum_j w_j u(x_j)`` of a feasible placement (the model's objective scale)."""
    return float(np.sum(problem.weight * utility(job_values(problem, placement), problem.p)))


@dataclass
class _Rounds:
    """Where the rounds of one solve ended (utility-sum scale)."""

    best: np.ndarray | None  # int64[J, N] best feasible placement found, None if none
    best_value: float  # its utility sum (-inf if none)
    bound: float  # upper bound on the utility sum of every feasible placement
    certified: bool  # the last round's offer provably contains an optimum
    run: HighsRun  # the last HiGHS run
    count: int  # rounds run
    offered: np.ndarray  # bool[O] options of the last round
    build_seconds: float
    solve_seconds: float


def _solve_rounds(
    problem: Problem,
    formulation: Formulation,
    table: OptionTable,
    rel: Relaxation,
    t0: float,
    deadline: float | None,
    highs_options: dict,
) -> _Rounds:
    """Solve rounds of offered options until one is certified, times out, or the formulation stops."""
    rc = rel.reduced_cost
    scale = max(abs(rel.bound), 1.0)
    offered = formulation.offered(problem, table, rel)
    slots = formulation.slots(problem)
    slots_restricted = slots and not problem.interference_avoidance
    start = start_placement(problem, table, slots)
    out = _Rounds(None, -math.inf, rel.bound, False, None, 0, offered, 0.0, 0.0)
    t1 = t0
    while True:
        out.count += 1
        excluded_rc = float(np.min(rc[~offered], initial=math.inf))
        graph = packing_graph(problem, table, offered, excluded_rc, slots)
        model = pyomo_model(problem, table, graph)
        form = standard_form(model)
        warm = warm_start_values(problem, table, graph, start)
        t2 = time.perf_counter()
        remaining = None if deadline is None else max(deadline - t2, MIN_TIME_LIMIT)
        run = run_highs(model, form, warm, time_limit=remaining, dive=formulation.dive, **highs_options)
        placement = _feasible_placement(problem, table, graph, run)
        if placement is not None:
            value = utility_sum(problem, placement)
            if value > out.best_value:
                out.best, out.best_value = placement, value
        t3 = time.perf_counter()
        out.build_seconds += t2 - t1
        out.solve_seconds += t3 - t2  # HiGHS and decoding its answer
        # Every placement worth more than rel.bound - excluded_rc uses offered options only,
        # so the model's bound holds for the problem unless the slots are a restriction.
        model_bound = run.bound if math.isfinite(run.bound) and not slots_restricted else rel.bound
        out.bound = min(rel.bound, max(model_bound, rel.bound - excluded_rc, out.best_value))
        out.certified = (
            rel.bound - excluded_rc <= out.best_value + UTILITY_RTOL * scale and not slots_restricted
        )
        out.run, out.offered = run, offered
        if out.certified or out.best is None or stopped_early(run.model_status) or offered.all():
            return out
        widened = formulation.widen(rel, offered, out.best_value)
        if widened is None:
            return out
        offered, start = widened, out.best
        t1 = time.perf_counter()


def _feasible_placement(
    problem: Problem, table: OptionTable, graph: PackingGraph, run: HighsRun
) -> np.ndarray | None:
    """The placement HiGHS's solution decodes to, None if it has none or it is infeasible (logged)."""
    if run.values is None:
        return None
    placement = decode_placement(problem, table, graph, run.values)
    broken = violations(problem, placement)
    if broken:
        log.error("HiGHS returned a solution that decodes to an infeasible placement: %s", broken)
        return None
    return placement


def _status(rounds: _Rounds, rel: Relaxation, mip_gap: float) -> Status:
    """HiGHS's status of the last run, made OPTIMAL or FEASIBLE by the bound against the whole problem."""
    has_solution = rounds.best is not None
    status = result_status(rounds.run.model_status, has_solution)
    scale = max(abs(rel.bound), 1.0)
    slack = mip_gap * max(abs(rounds.bound), abs(rounds.best_value)) + UTILITY_RTOL * scale
    within_gap = has_solution and rounds.bound - rounds.best_value <= slack
    if has_solution and status is Status.OPTIMAL and not within_gap and not rounds.certified:
        status = Status.FEASIBLE  # optimal among the offered options only
    elif has_solution and within_gap:
        status = Status.OPTIMAL
    return status


def _result(
    problem: Problem, formulation: Formulation, table: OptionTable, rel: Relaxation, rounds: _Rounds, status: Status
) -> Result:
    """The :class:`Result`, with objective and bound on the power-mean scale."""
    placement = rounds.best if rounds.best is not None else problem.current.copy()
    objective = evaluate(problem, placement) if not violations(problem, placement) else float("nan")
    w_sum = float(problem.weight.sum())
    if w_sum == 0:
        bound_mean = objective  # no jobs: the empty placement is all there is
    else:
        bound_mean = mean_from_utility_sum(rounds.bound, w_sum, problem.p)
        bound_mean = max(bound_mean, objective) if math.isfinite(objective) else bound_mean
    gap = float("nan")
    if math.isfinite(bound_mean) and bound_mean != 0:
        gap = (bound_mean - objective) / abs(bound_mean)
    run = rounds.run
    return Result(
        placement=placement,
        status=status,
        objective=objective,
        bound=bound_mean,
        gap=max(gap, 0.0) if math.isfinite(gap) else gap,
        build_seconds=rounds.build_seconds,
        solve_seconds=rounds.solve_seconds,
        solver="milp",
        message=run.message,
        stats={
            "formulation": formulation.name,
            "rounds": rounds.count,
            "options": int(table.job.size),
            "options_offered": int(rounds.offered.sum()),
            "columns": run.columns,
            "rows": run.rows,
            "mip_nodes": run.mip_nodes,
            "relaxation_bound": mean_from_utility_sum(rel.bound, w_sum, problem.p) if w_sum else 0.0,
        },
    )
