r"""Large-cluster formulation: an aggregated relaxation for the bound, a restricted MILP to realise it.

``solve_milp(problem, formulation="large")`` (and ``"auto"`` from
``AUTO_LARGE_CPUS`` CPUs on) solves the same arc-flow model as the exact
formulation (:mod:`solvers._milp`), restricted three ways, and reports the
true objective of its placement against a bound that holds for the
*unrestricted* problem.  ``docs/formulation.md`` has the measured costs.

Bound.  The aggregated relaxation keeps one choice per job and replaces the
node-level packing by two totals (replicas <= total capacity; with
interference avoidance, nodes spanned by multi-node jobs <= number of nodes).
Its Lagrangian dual, minimised over the two prices by :func:`solvers._milp.relax`,
is an upper bound L on the utility sum of every feasible placement; an option
o has reduced cost rc_o, and a placement using it is worth at most L - rc_o.
The bound reported is ``min(L, max(LP bound of the restricted model, L - min
rc over options left out))``, so the gap is honest: it compares the placement
with what *any* placement could reach.

Restrictions (each keeps every answer feasible for the real problem).

1. Options: each job is offered its ``OPTIONS_PER_JOB`` options of lowest
   reduced cost (plus keeping its placement), instead of all of them.
2. Slots: at most one multi-node job per node even without interference
   avoidance, so the packing graph keeps two layers instead of one per
   multi-node job.
3. Dive: when the LP relaxation of the restricted model is fractional, every
   choice it made whole (y or k at 1) is fixed and the MIP decides only the
   rest; if that finds nothing, the restricted MIP runs in full.

The status is ``Status.OPTIMAL`` only when the bound proves the placement
within ``mip_gap``; otherwise ``Status.FEASIBLE`` (or a time-limit status).
"""

from __future__ import annotations

import numpy as np

from ._milp import Choices, Relaxation
from ._problem import Problem

__all__ = ["offer", "OPTIONS_PER_JOB"]

#: Options offered per job, lowest reduced cost first.  On random 512 x 4-CPU
#: clusters with 1000 jobs, 3 lost at most 0.06 % against the exact optimum
#: where that could be computed (docs/formulation.md).
OPTIONS_PER_JOB = 3


def offer(problem: Problem, ch: Choices, rel: Relaxation) -> np.ndarray:
    """bool[O]: each job's ``OPTIONS_PER_JOB`` options of lowest reduced cost.

    Options that cannot be placed at all (infinite reduced cost) are never offered.
    """
    del problem  # the choice depends on the prices only
    order = np.lexsort((rel.reduced_cost, ch.job))
    job = ch.job[order]
    rank = np.arange(job.size) - np.searchsorted(job, job, side="left")
    offered = np.zeros(ch.job.size, dtype=bool)
    offered[order[rank < OPTIONS_PER_JOB]] = True
    return offered & np.isfinite(rel.reduced_cost)
