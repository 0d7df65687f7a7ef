"""Exact MILP for the allocation problem: one option per job, nodes packed by arc flow.

The model is a Pyomo ``ConcreteModel``; the solver hands HiGHS (through
highspy) the same model as arrays, assembled from the same rules.
``docs/formulation.md`` has the full write-up with measured figures.
Counting nodes by the paths they take through a small packing graph, instead
of naming each node, removes the symmetry between nodes that made a
node-indexed model slow (a 0.3 % gap left after 15 s on 16 x 4 CPUs and 20
jobs).

The stages, one module each, in the order :func:`solve_milp` runs them:

* :mod:`~solvers.milp.options`: the solver options' checks and defaults;
  each job's *options* (runs of undominated configurations) and their worth;
* :mod:`~solvers.milp.bound`: the Lagrangian bound of the aggregated
  relaxation and each option's reduced cost;
* :mod:`~solvers.milp.strategy`: the exact and the restricted ("large")
  formulation, which decide what each round's model offers;
* :mod:`~solvers.milp.packing`: the arc-flow packing graph, over the node
  states of :mod:`~solvers.milp.states` (what the holding nodes may keep);
* :mod:`~solvers.milp.structure`: the index lists the rules read;
* :mod:`~solvers.milp.model`: the Pyomo model (one named rule per
  constraint family);
* :mod:`~solvers.milp.compiled`: the model as arrays, assembled from the
  same rules and kept per structure between solves;
* :mod:`~solvers.milp.warmstart`: placements to warm-start values, and
  solutions back to placements;
* :mod:`~solvers.milp.highs`: the HiGHS adapter, its stages run on
  :mod:`~solvers.milp.highs_model` (one HiGHS instance holding the model, its
  runs whole or with some choices fixed: packing the LP's integral choices,
  the LP dive) and :mod:`~solvers.milp.greedy_pack` (typed rounds: a greedy
  packing of those choices, tried first);
* :mod:`~solvers.milp.solve`: :class:`MilpSolver` (the registry's solver, with its
  structure cache) and :func:`solve_milp`, the rounds and the result;
* :mod:`~solvers.milp.export`: :func:`write_model`, the model as an LP or
  MPS file for other MILP solvers.
"""

from __future__ import annotations

from .bound import Relaxation, relax
from .export import MODEL_FORMATS, write_model
from .highs import highs_status
from .model import build_model
from .options import DEFAULT_MIP_GAP, FORMULATIONS, OptionTable, option_table, prune_dominated
from .solve import MilpSolver, solve_milp
from .strategy import AUTO_LARGE_OPTIONS, ExactFormulation, Formulation, RestrictedFormulation, choose_formulation

__all__ = [
    "AUTO_LARGE_OPTIONS",
    "DEFAULT_MIP_GAP",
    "FORMULATIONS",
    "MODEL_FORMATS",
    "ExactFormulation",
    "Formulation",
    "MilpSolver",
    "OptionTable",
    "Relaxation",
    "RestrictedFormulation",
    "build_model",
    "choose_formulation",
    "highs_status",
    "option_table",
    "prune_dominated",
    "relax",
    "solve_milp",
    "write_model",
]
