"""Evolutionary solver: a genetic algorithm over placement matrices, in JAX.

Pollux (Qiao et al., OSDI 2021, section 4.2) allocates with a genetic algorithm
over allocation matrices (population 100, 100 generations per round, NSGA-II in
numpy).  This package keeps that search space and kind of operators but runs
the whole search as compiled XLA programs: the population is scored with
``vmap`` and the generations are a ``lax.while_loop``.

* :mod:`~solvers.evolutionary.search`: a problem-agnostic genetic search,
  pure init / ask / tell over an immutable state with explicit PRNG keys (in
  the style of evosax);
* :mod:`~solvers.evolutionary.encoding`: the problem as padded arrays,
  placements as node-major genomes, and their fitness;
* :mod:`~solvers.evolutionary.repair`: making any placement feasible by
  removing replicas;
* :mod:`~solvers.evolutionary.variation`: mutation and growth, and the
  allocation genome that ties them to the search;
* :mod:`~solvers.evolutionary.solver`: :func:`solve_evolutionary`, compiling
  and running the search and choosing the answer.

jax is an optional dependency (``pip install 'pollux-opt[evo]'``), imported
only when the solver runs.
"""

from __future__ import annotations

from .encoding import PaddedProblem, pad_problem, score
from .search import Draws, Genome, SearchConfig, SearchState, ask, draws, evolve, init, step, tell
from .solver import DEFAULT_GENERATIONS, DEFAULT_POPULATION_SIZE, solve_evolutionary
from .variation import AllocationGenome, grow, mutate

__all__ = [
    "DEFAULT_GENERATIONS",
    "DEFAULT_POPULATION_SIZE",
    "AllocationGenome",
    "Draws",
    "Genome",
    "PaddedProblem",
    "SearchConfig",
    "SearchState",
    "ask",
    "draws",
    "evolve",
    "grow",
    "init",
    "mutate",
    "pad_problem",
    "score",
    "solve_evolutionary",
    "step",
    "tell",
]
