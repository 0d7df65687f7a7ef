"""HiGHS runs with some choices fixed: packing the LP's integral choices, and the LP dive (and its repair).

Both follow a fractional LP relaxation in :func:`solvers.milp.highs.run_highs`:
fix some choice columns to the LP's values, solve the MIP that is left, and
keep its answer if it is good enough, else restore the bounds
(:func:`_fixed_run`, :func:`_restore`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .highs import HighsRun, _HighsCall

__all__ = ["INTEGRALITY_TOL", "TYPED_DIVE_GAP", "dive", "pack_lp_choices", "primal_matches_objective"]

#: HiGHS ``primal_solution_status`` value of a feasible primal solution (kSolutionStatusFeasible).
PRIMAL_FEASIBLE = 2

#: Relative tolerance when checking HiGHS's primal against its reported objective.
OBJECTIVE_RTOL = 1e-6

#: A relaxed LP solution counts as integral when every integer column is this
#: close to an integer (HiGHS's own MIP feasibility tolerance is 1e-6).
INTEGRALITY_TOL = 1e-7

#: A typed round's LP dive (the large formulation) is kept only within this
#: fraction of the LP bound (utility-sum scale); else the full MIP runs.  On
#: 2048 GPUs of three types with 1000 jobs (seeds 0 to 4), the dives that
#: left room for every job came within 3e-4, those that left a job nothing
#: 0.75 short, and their greedy repairs (:func:`_repaired_dive`) within 9.2e-4.
TYPED_DIVE_GAP = 1e-3

#: The model's choice variables: whole options, kept jobs, job sizes, segments (the rest is the packing).
_CHOICES = ("y", "k", "z", "g")


def primal_matches_objective(h, c: np.ndarray, offset: float, info) -> bool:
    """True when ``c @ x + offset`` of HiGHS's primal equals its reported objective."""
    x = np.asarray(h.getSolution().col_value)
    value = float(c @ x + offset)
    reported = float(info.objective_function_value)
    return abs(value - reported) <= OBJECTIVE_RTOL * max(1.0, abs(reported))


def _fixed_run(call: "_HighsCall", cols: np.ndarray, values: np.ndarray):
    """Run the MIP with columns ``cols`` (int32) fixed to ``values``; HiGHS's info after the run."""
    call.h.changeColsBounds(cols.size, cols, values, values)
    call.run()
    return call.h.getInfo()


def _restore(call: "_HighsCall", cols: np.ndarray) -> None:
    """Give columns ``cols`` their model bounds back and drop the fixed run's solver state."""
    form = call.form
    call.h.changeColsBounds(cols.size, cols, form.col_lo[cols], form.col_up[cols])
    call.h.clearSolver()


def pack_lp_choices(
    call: "_HighsCall", x: np.ndarray, lp_bound: float, packer: Callable[[dict], np.ndarray | None] | None = None
) -> "HighsRun | None":
    """The MIP's optimum when the LP optimum ``x`` chose integrally and only its packing is fractional.

    When every choice column (``y``, ``k``, ``z``, ``g``) of ``x`` is integral,
    any integral packing of those choices is worth the LP optimum, an upper
    bound on the MIP.  ``packer`` (choices by variable name -> a placement
    realising them, or None; :func:`solvers.milp.greedy_pack.pack_choices`)
    is tried first; if it finds none, fixing the choices leaves a packing
    feasibility MIP, far quicker than the full one, whose answer, when it
    reaches the LP bound, is a proven optimum.  None (bounds restored)
    when the choices are fractional, cannot be packed, or fall short of
    the bound.
    """
    import highspy

    index, form = call.index, call.form
    choice = np.concatenate([index[name] for name in _CHOICES])
    choice = choice[choice >= 0].astype(np.int32)
    values = np.rint(x[choice])
    if choice.size == 0 or np.any(np.abs(x[choice] - values) > INTEGRALITY_TOL):
        return None
    optimal = highspy.HighsModelStatus.kOptimal
    if packer is not None:
        rounded = x.copy()
        rounded[call.ints] = np.rint(x[call.ints])
        chosen = call.values_of(rounded)
        placement = packer(chosen)
        if placement is not None:
            message = "LP choices integral; packed greedily"
            return call.outcome(chosen, optimal, lp_bound, message, -1, placement=placement)
    info = _fixed_run(call, choice, values)
    reached = float(info.objective_function_value) >= lp_bound - OBJECTIVE_RTOL * max(1.0, abs(lp_bound))
    matches = primal_matches_objective(call.h, form.c, form.offset, info)
    if info.primal_solution_status == PRIMAL_FEASIBLE and reached and matches:
        return call.outcome(
            call.values_of(call.rounded_solution()),
            optimal,
            lp_bound,
            "LP choices integral; their packing solved as a MIP",
            int(info.mip_node_count),
        )
    _restore(call, choice)
    return None


def dive(
    call: "_HighsCall",
    x: np.ndarray,
    lp_bound: float,
    accept_gap: float | None = None,
    repair: Callable[[dict], tuple | None] | None = None,
) -> "HighsRun | None":
    """MIP with every choice the LP optimum ``x`` made whole fixed to 1; None (bounds restored) if infeasible.

    With ``accept_gap``, also None when the dive's answer falls short of the
    LP bound by more than that fraction of ``max(1, |LP bound|)``: fixing the
    whole choices can leave the undecided jobs no room, and a job that holds
    nothing costs the power mean far more than the MIP the dive avoids.
    ``repair`` (the LP's values by name -> (placement, utility sum, settled)
    or None; :func:`solvers.milp.greedy_pack.repair_choices`) is then tried
    (:func:`_repaired_dive`), its answer kept on the same terms.
    """
    index = call.index
    floor = -np.inf if accept_gap is None else lp_bound - accept_gap * max(1.0, abs(lp_bound))
    message = "LP dive: choices the LP made whole fixed, the rest solved as a MIP"
    dived = _fixed_dive(call, x, np.concatenate([index["y"], index["k"]]), lp_bound, floor, message)
    if dived is not None or repair is None:
        return dived
    repaired = repair(call.values_of(x))
    return None if repaired is None else _repaired_dive(call, x, lp_bound, floor, repaired)


def _fixed_dive(call: "_HighsCall", x: np.ndarray, choice: np.ndarray, lp_bound: float, floor: float,
                message: str) -> "HighsRun | None":
    """The MIP with the columns ``choice`` (-1: none) that the LP optimum ``x`` made whole fixed to 1:
    its answer if feasible and worth at least ``floor``, else None (bounds restored)."""
    import highspy

    choice = choice[choice >= 0]
    decided = choice[x[choice] >= 1 - INTEGRALITY_TOL].astype(np.int32)
    info = _fixed_run(call, decided, np.ones(decided.size))
    if info.primal_solution_status == PRIMAL_FEASIBLE and float(info.objective_function_value) >= floor:
        return call.outcome(call.values_of(call.rounded_solution()), highspy.HighsModelStatus.kOptimal, lp_bound,
                            message, int(info.mip_node_count), proven=False)
    _restore(call, decided)
    return None


def _repaired_dive(call: "_HighsCall", x: np.ndarray, lp_bound: float, floor: float, repaired: tuple) -> "HighsRun | None":
    """The dive again, fixing only the whole choices that the greedy ``repaired`` realised as the LP chose.

    ``repaired`` is (placement, its utility sum, settled: bool by name, ``y``
    and ``k``) of :func:`solvers.milp.greedy_pack.repair_choices`; that
    placement shows the fixed choices can be packed.  The better of the MIP's
    answer and the placement, if at least ``floor``; else None (bounds restored).
    """
    import highspy

    placement, value, settled = repaired
    index = call.index
    choice = np.concatenate([index["y"][settled["y"]], index["k"][settled["k"]]])
    message = "LP dive: the whole choices a greedy packing kept fixed, the rest solved as a MIP"
    dived = _fixed_dive(call, x, choice, lp_bound, max(floor, value), message)
    if dived is not None or value < floor:
        return dived
    message = "LP dive: the LP's choices rounded and packed greedily"
    return call.outcome(call.values_of(x), highspy.HighsModelStatus.kOptimal, lp_bound, message, -1, proven=False,
                        placement=placement)
