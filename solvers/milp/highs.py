"""Stage 5 of the MILP: the HiGHS adapter (highspy), from a compiled model to rounded variable values.

:func:`run_highs` solves the LP relaxation first and runs the MIP only if it
is fractional (optionally after an LP-guided dive), warm-started from a
placement.  HiGHS model statuses map to :class:`solvers.Status` through the
table :func:`highs_status` (as scipy's ``milp`` maps them to its own codes).
One HiGHS instance holds the model through every stage
(:class:`~solvers.milp.highs_model.HighsModel`).  HiGHS 1.16 sometimes
returns the warm start as its primal together with the optimum's objective;
that is detected and re-solved cold (:func:`_solve_mip`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np

from ..result import Status
from .compiled import CompiledModel
from .highs_model import INTEGRALITY_TOL, PRIMAL_FEASIBLE, HighsModel, HighsRun, primal_matches_objective

__all__ = [
    "SMALL_TYPED_OPTIONS",
    "highs_status",
    "result_status",
    "run_highs",
    "stopped_early",
]

log = logging.getLogger(__name__)

#: Row activity tolerance when accepting a rounded LP solution (HiGHS's primal feasibility tolerance).
_ROW_TOL = 1e-7

#: HiGHS options for a small typed model (a few hundred columns, its MIP run
#: without a warm start): presolve took a third of its LP relaxation, and
#: presolve with the feasibility-jump heuristic more than half of its MIP,
#: whose root node usually closes it.
SMALL_TYPED_OPTIONS = MappingProxyType({"presolve": "off", "mip_heuristic_run_feasibility_jump": False})

@functools.cache
def highs_status() -> Mapping:
    """HiGHS model status -> (status when a feasible solution exists, status when not);
    any status not listed maps to ``Status.ERROR``.  Built on first use (highspy import)."""
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
    return MappingProxyType(table)


def result_status(model_status, has_solution: bool) -> Status:
    """The :class:`Status` of a HiGHS model status, by :func:`highs_status`."""
    return highs_status().get(model_status, (Status.ERROR, Status.ERROR))[0 if has_solution else 1]


def stopped_early(model_status) -> bool:
    """True when HiGHS stopped on its time limit or an interrupt."""
    import highspy

    ms = highspy.HighsModelStatus
    return model_status in (ms.kTimeLimit, ms.kInterrupt)


def run_highs(
    form: CompiledModel,
    start: dict | Callable[[], dict] | None,
    *,
    time_limit,
    mip_gap,
    threads,
    verbose,
    seed,
    dive=False,
    dive_gap=None,
    pack_choices=False,
    repair=None,
    options=None,
) -> HighsRun:
    """Solve the compiled model ``form``: its LP relaxation, then the MIP if that is fractional.

    An integral optimum of the LP relaxation is an optimum of the MIP, and on
    most small instances here the arc-flow relaxation is integral
    (docs/formulation.md), so this skips HiGHS's MIP set-up (presolve,
    probing, heuristics), which costs several times the LP itself.

    With ``dive`` (the restricted formulation), a fractional LP is followed
    by a MIP in which every choice the LP made whole (y or k at 1) is fixed;
    only the undecided jobs and the packing stay free.  That MIP is small and
    fast; its answer is feasible but not proven optimal, so the bound
    returned is the LP optimum.  If it finds nothing (or, with ``dive_gap``,
    nothing within that fraction of the LP bound), the full MIP runs.

    With ``pack_choices`` (typed problems, whose LP optimum often chooses
    integrally and packs fractionally), a fractional LP is first followed by
    the packing of its choices (:meth:`~solvers.milp.highs_model.HighsModel.pack_lp_choices`;
    a callable ``pack_choices`` is its greedy packer), a proven optimum
    when it succeeds.

    ``repair`` (the LP's values by name -> (placement, utility sum) or
    None) follows a dive that found nothing good enough (see
    :meth:`~solvers.milp.highs_model.HighsModel.dive`).

    ``options`` (HiGHS option name -> value, e.g. :data:`SMALL_TYPED_OPTIONS`)
    are set for every stage.

    Args:
        start: warm-start values by variable name
            (:func:`solvers.milp.warmstart.warm_start_values`), a function
            returning them (called only when the MIP runs), or None.
        time_limit: seconds for all HiGHS runs together (None: no limit).
        mip_gap, threads, verbose, seed: HiGHS's ``mip_rel_gap``, ``threads``,
            ``output_flag`` and ``random_seed`` (None: HiGHS default).
    """
    import highspy

    call = HighsModel(form, time_limit=time_limit, mip_gap=mip_gap, threads=threads, verbose=verbose, seed=seed)
    for name, value in (options or {}).items():
        call.h.setOptionValue(name, value)
    call.run()
    lp_optimal = call.h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    if lp_optimal:
        lp_bound = float(call.h.getInfo().objective_function_value)
        x = np.asarray(call.h.getSolution().col_value)
        integral = _integral_lp_solution(call, x, lp_bound)
        if integral is not None:
            return integral

    if call.out_of_time():
        return call.timed_out("the LP relaxation")
    ints = call.ints
    call.h.changeColsIntegrality(ints.size, ints.astype(np.int32), np.ones(ints.size, dtype=np.uint8))
    if pack_choices and lp_optimal:
        packed = call.pack_lp_choices(x, lp_bound, pack_choices if callable(pack_choices) else None)
        if packed is not None:
            return packed
        if call.out_of_time():
            return call.timed_out("the packing of the LP's choices")
    if dive and lp_optimal:
        dived = call.dive(x, lp_bound, dive_gap, repair)
        if dived is not None:
            return dived
        if call.out_of_time():
            return call.timed_out("the LP dive")
    if callable(start):
        start = start()
    if start is not None:
        _set_warm_start(call, start)
    return _solve_mip(call)


def _integral_lp_solution(call: HighsModel, x: np.ndarray, lp_bound: float) -> HighsRun | None:
    """The LP optimum ``x`` as the MIP's answer if it is integral (within tolerances), else None."""
    import highspy

    form, ints = call.form, call.ints
    rounded = x.copy()
    rounded[ints] = np.rint(x[ints])
    activity = form.A @ rounded
    if (
        np.all(np.abs(x[ints] - rounded[ints]) <= INTEGRALITY_TOL)
        and np.all(activity >= form.row_lo - _ROW_TOL)
        and np.all(activity <= form.row_up + _ROW_TOL)
    ):
        return call.outcome(
            call.values_of(rounded), highspy.HighsModelStatus.kOptimal, lp_bound, "LP relaxation integral", -1
        )
    return None


def _set_warm_start(call: HighsModel, start: dict) -> None:
    """Hand HiGHS the warm start ``start`` (values by variable name) as its starting solution."""
    import highspy

    sol = highspy.HighsSolution()
    sol.col_value = call.form.column_vector(start).tolist()
    sol.value_valid = True
    call.h.setSolution(sol)


def _solve_mip(call: HighsModel) -> HighsRun:
    """Run the MIP and read its answer, re-solving cold if the primal does not match the objective."""
    import highspy

    h = call.h
    call.run()
    info = h.getInfo()
    has_solution = info.primal_solution_status == PRIMAL_FEASIBLE
    if has_solution and not primal_matches_objective(h, call.form.c, call.form.offset, info):
        # HiGHS 1.16 can report the optimum of a presolved run yet hand back the
        # user's start as its primal solution; solving again without the start
        # returns the primal that goes with the reported objective.
        log.warning("HiGHS primal does not match its objective; re-solving without the warm start")
        h.clearSolver()
        h.setSolution(highspy.HighsSolution())
        call.run()
        info = h.getInfo()
        has_solution = info.primal_solution_status == PRIMAL_FEASIBLE
    model_status = h.getModelStatus()
    values = call.values_of(call.rounded_solution()) if has_solution else None
    bound = float(info.mip_dual_bound)
    return call.outcome(
        values,
        model_status,
        bound if math.isfinite(bound) else float("nan"),
        h.modelStatusToString(model_status),
        int(info.mip_node_count),
    )
