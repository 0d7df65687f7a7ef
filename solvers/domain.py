"""The domain of every numeric field of :class:`solvers.Problem`, with the reason for each bound.

:class:`solvers.Problem` rejects a value outside with :class:`solvers.InvalidProblem`
naming the field and the value; docs/formulation.md has the same table.  The
domain layer (``pollux_opt``) mirrors these bounds on its own inputs.

=====================  ===============================  ===========================================
field                  domain                           reason
=====================  ===============================  ===========================================
capacity               integers in [1, MAX_CPUS]        int32 placements of the evolutionary solver
max_replicas           integers in [0, MAX_REPLICAS]    the same (configurations lie below it)
max_nodes_per_job      integers in [1, MAX_REPLICAS]    a job spans at most its replicas' nodes
cfg_speedup            finite, in [0, MAX_SPEEDUP]      linear scaling to MAX_REPLICAS replicas
weight                 in WEIGHT_RANGE                  finite sums; HiGHS's cost range
p                      in P_RANGE                       the MILP's linear utility stays exact
restart_factor         in [0, 1]                        a factor of the speedup
=====================  ===============================  ===========================================
"""

from __future__ import annotations

__all__ = ["MAX_CPUS", "MAX_REPLICAS", "MAX_SPEEDUP", "P_RANGE", "WEIGHT_RANGE"]

#: Largest capacity of one node: the evolutionary solver holds placements in
#: int32 (and sums over nodes stay far inside int64 for any node count that
#: fits in memory).  No solver allocates an array over a node's capacity.
MAX_CPUS = 2**31 - 1
#: Largest ``max_replicas`` (and so configuration replica count and
#: ``max_nodes_per_job``): int32 as for ``MAX_CPUS``.
MAX_REPLICAS = 2**31 - 1
#: Largest speedup: linear scaling from one replica to ``MAX_REPLICAS``.  It
#: keeps ``log(speedup + EPS)`` within [-7, 22], which the utility scales and
#: the float32 fitness of the evolutionary solver rely on.
MAX_SPEEDUP = float(2**31)
#: Closed range of ``p``.  The power mean itself is computed stably for any
#: finite p, but the MILP is linear in ``w_j u(x_j)``, whose "hold nothing"
#: term exceeds the others by ``(speedup / EPS)^|p|`` for p < 0: at p = -6 on
#: unit speedups (1e18) HiGHS returned wrong optima, at p = -5 (1e15) it did
#: not (docs/formulation.md).  Positive p is bounded symmetrically.
P_RANGE = (-5.0, 5.0)
#: Closed range of each weight: relative priorities, a ratio of 1e12 between
#: two jobs at most.  Sums over any job count stay finite, and a weighted
#: utility stays below HiGHS's infinite cost (1e20) after the MILP's scaling.
WEIGHT_RANGE = (1e-6, 1e6)
