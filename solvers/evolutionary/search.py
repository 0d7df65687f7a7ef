"""A problem-agnostic genetic search in JAX: pure init / ask / tell over immutable state.

Written in the style of evosax and optax: the search state is an immutable
:class:`SearchState`, every random number comes from an explicit PRNG key,
and each function is pure, so the whole search compiles to XLA (the
population is handled with ``vmap``, the generations with ``lax.while_loop``).
What the search knows of the problem is a :class:`Genome`: how to score a
population and how to turn crossed-over children into valid ones.

A genome is an array whose last axis indexes *genes* (for the allocation
problem: jobs).  One generation:

* :func:`ask` (key, state) -> children: binary tournament selection, then
  uniform crossover over genes (with probability ``crossover_probability``
  each child takes each gene whole from one of two tournament winners, else
  all from the first), then ``Genome.vary``;
* :func:`tell` (state, children, fitness) -> state: (mu + lambda) elitism,
  keep the best ``P`` of parents and children;
* :func:`step` = ask + tell with the key ``fold_in(key, generation)``, taking
  the children's fitness from ``Genome.vary``; :func:`evolve` loops over it
  (with the same keys, drawing the threefry words of all its generations
  before the loop).

All random numbers of a generation come from one small threefry draw
expanded by a counter-based hash (:func:`draws`).

jax is an optional dependency (``pip install 'pollux-opt[evo]'``), imported
only when a function here runs (:func:`import_jax`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

import numpy as np

__all__ = [
    "CROSSOVER_PROBABILITY",
    "Draws",
    "Genome",
    "SearchConfig",
    "SearchState",
    "ask",
    "draws",
    "draws_from_bits",
    "evolve",
    "gene_rank",
    "generation_bits",
    "import_jax",
    "init",
    "step",
    "tell",
]

#: Probability that a child is a crossover of two parents (else a copy of one).
CROSSOVER_PROBABILITY = 0.5
#: Columns of ``Draws.individual`` the search itself reads: four tournament
#: contenders, then CROSS (whether to cross over); the genome's own columns follow.
CONTENDERS, CROSS = 4, 4
SEARCH_INDIVIDUAL_DRAWS = 5
#: Row of ``Draws.gene`` the crossover reads (the last; the genome's rows come first).
MIX = -1
#: Each random 32-bit word gives two 16-bit uniforms (2^-16 resolution is ample
#: for these rates).
UINT16_MASK = 0xFFFF
#: Multipliers of the lowbias32 integer hash (C. Wellons, "Prospecting for hash
#: functions", 2018), and the counter step between derived words (the 32-bit
#: golden ratio, as in splitmix).
MIX_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
MIX_INCREMENT = 0x9E3779B9

_INSTALL_HINT = "the 'evolutionary' solver needs jax: pip install 'pollux-opt[evo]'"


def import_jax() -> Any:
    """Import jax lazily, with the install hint when it is missing."""
    try:
        import jax
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(_INSTALL_HINT) from exc
    return jax


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Static hyperparameters of the search (hashable, so jit-static)."""

    population_size: int
    crossover_probability: float = CROSSOVER_PROBABILITY


class SearchState(NamedTuple):
    """Immutable state of the search: a population and where it stands."""

    population: Any  # [P, ..., G] genomes
    fitness: Any  # float32[P]: higher is better, -inf if infeasible
    generation: Any  # int32[]: generations done (keys are folded with it)


class Draws(NamedTuple):
    """The random numbers of one generation (:func:`draws`), uniforms in [0, 1) unless noted."""

    gene: Any  # float32[P, Genome.gene_draws + 1, G]: per child and gene; the last row is the crossover's
    individual: Any  # float32[P, 5 + Genome.individual_draws]: tournament, crossover, then the genome's
    rank: Any  # int32[G]: the generation's gene ranking (a random permutation)


class Genome(Protocol):
    """The problem side of the search (hashable, so jit-static).

    Attributes:
        gene_draws: uniforms per child and gene that ``vary`` reads (rows
            ``0 .. gene_draws - 1`` of ``Draws.gene``).
        individual_draws: uniforms per child that ``vary`` reads (columns
            ``5 ..`` of ``Draws.individual``).
    """

    gene_draws: int
    individual_draws: int

    def score(self, population: Any, params: Any) -> Any:
        """Fitness float32[P] of a population [P, ..., G]."""

    def vary(self, d: Draws, children: Any, params: Any) -> tuple[Any, Any]:
        """(children, their fitness float32[P]) from crossed-over children [P, ..., G]."""


def _mix32(x: Any) -> Any:
    """The lowbias32 hash of uint32 (see ``MIX_MULTIPLIERS``): a bijection whose
    every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * np.uint32(MIX_MULTIPLIERS[0])
    x = x ^ (x >> 15)
    x = x * np.uint32(MIX_MULTIPLIERS[1])
    return x ^ (x >> 16)


def _words(genome: Genome) -> tuple[int, int]:
    """(32-bit words per child and gene, per child) of one generation's draws."""
    per_gene = -(-(genome.gene_draws + 1) // 2)
    per_individual = -(-(SEARCH_INDIVIDUAL_DRAWS + genome.individual_draws) // 2)
    return per_gene, per_individual


def generation_bits(key: Any, size: int, genome: Genome) -> Any:
    """uint32[size + 1, 1 + words per child]: the one threefry draw of a generation (see :func:`draws`)."""
    jax = import_jax()
    import jax.numpy as jnp

    return jax.random.bits(key, (size + 1, 1 + _words(genome)[1]), jnp.uint32)


def _gene_words(base: Any, n_words: int) -> Any:
    """uint32[..., n_words]: the counter-based stream of each base word (see :func:`draws`)."""
    counter = np.arange(1, n_words + 1, dtype=np.uint32) * np.uint32(MIX_INCREMENT)
    return _mix32(base[..., None] + counter)


def gene_rank(bits: Any, n_genes: int) -> Any:
    """int32[G]: the generation's gene ranking, from its :func:`generation_bits` (``Draws.rank``)."""
    import jax.numpy as jnp

    order = jnp.argsort(_gene_words(bits[-1, 0], n_genes))
    return jnp.argsort(order).astype(jnp.int32)


def draws_from_bits(bits: Any, rank: Any, n_genes: int, genome: Genome) -> Draws:
    """The :class:`Draws` of a generation from its :func:`generation_bits` and :func:`gene_rank`."""
    import jax.numpy as jnp

    size = bits.shape[0] - 1
    per_gene, _ = _words(genome)
    words = _gene_words(bits[:size, 0], per_gene * n_genes)  # [P, per_gene * G]
    gene_words = words.reshape(size, per_gene, n_genes)
    gene_halves = jnp.concatenate([gene_words & UINT16_MASK, gene_words >> 16], axis=1)
    tail = bits[:size, 1:]
    halves = jnp.concatenate([tail & UINT16_MASK, tail >> 16], axis=1)
    scale = np.float32(1.0 / (UINT16_MASK + 1))
    return Draws(
        gene=gene_halves[:, : genome.gene_draws + 1].astype(jnp.float32) * scale,
        individual=halves[:, : SEARCH_INDIVIDUAL_DRAWS + genome.individual_draws].astype(jnp.float32) * scale,
        rank=rank,
    )


def draws(key: Any, size: int, n_genes: int, genome: Genome) -> Draws:
    """All random numbers of one generation, from one threefry draw of ``size + 1`` short rows.

    Threefry costs about 10 ns per 32-bit word on CPU, a large share of a
    generation if every random number came from it.  So it gives each child
    (and row ``size``: the ranking) one base word and a few more words
    (:func:`generation_bits`), and a counter-based stream derives the rest:
    word ``c`` of a row is :func:`_mix32` of ``base + c * MIX_INCREMENT`` (as
    in splitmix).  Each word gives two 16-bit uniforms.
    """
    bits = generation_bits(key, size, genome)
    return draws_from_bits(bits, gene_rank(bits, n_genes), n_genes, genome)


def init(seeds: Any, params: Any, config: SearchConfig, genome: Genome) -> SearchState:
    """Initial state: copies of the seeds [S, ..., G], cycled up to the population size.

    The seeds are scored as they are (an invalid one scores -inf and loses
    its place to its offspring in the first generation), so a run compiles
    the genome's variation only once, in :func:`step`.
    """
    import jax.numpy as jnp

    size = config.population_size
    population = seeds[jnp.arange(size) % seeds.shape[0]]
    return SearchState(population, genome.score(population, params), jnp.zeros((), jnp.int32))


def _breed(key: Any, state: SearchState, params: Any, config: SearchConfig, genome: Genome) -> tuple[Any, Any]:
    """Children [P, ..., G] and their fitness float32[P] (see :func:`ask`)."""
    n_genes = state.population.shape[-1]
    return _breed_with(draws(key, state.population.shape[0], n_genes, genome), state, params, config, genome)


def _breed_with(d: Draws, state: SearchState, params: Any, config: SearchConfig, genome: Genome) -> tuple[Any, Any]:
    """:func:`_breed` with the generation's draws given."""
    import jax.numpy as jnp

    pop, fit = state.population, state.fitness
    size, n_genes = pop.shape[0], pop.shape[-1]
    contenders = (d.individual[:, :CONTENDERS].T.reshape(2, 2, size) * size).astype(jnp.int32)
    first, second = contenders[:, 0], contenders[:, 1]
    parents = jnp.where(fit[first] >= fit[second], first, second)  # [2, P] binary tournaments
    cross = d.individual[:, CROSS] < config.crossover_probability
    from_b = (d.gene[:, MIX] < 0.5) & cross[:, None]  # [P, G]
    from_b = from_b.reshape((size,) + (1,) * (pop.ndim - 2) + (n_genes,))
    x = jnp.where(from_b, pop[parents[1]], pop[parents[0]])
    return genome.vary(d, x, params)


def ask(key: Any, state: SearchState, params: Any, config: SearchConfig, genome: Genome) -> Any:
    """Children [P, ..., G]: tournament, crossover over genes, then ``genome.vary``."""
    return _breed(key, state, params, config, genome)[0]


def tell(state: SearchState, children: Any, fitness: Any) -> SearchState:
    """(mu + lambda) elitism: keep the best P of parents and children."""
    jax = import_jax()
    import jax.numpy as jnp

    pool = jnp.concatenate([state.population, children])
    pool_fit = jnp.concatenate([state.fitness, fitness])
    best_fit, idx = jax.lax.top_k(pool_fit, state.population.shape[0])
    return SearchState(pool[idx], best_fit, state.generation + 1)


def step(key: Any, state: SearchState, params: Any, config: SearchConfig, genome: Genome) -> SearchState:
    """One generation, ask + tell, with the key ``fold_in(key, state.generation)``.

    The children's fitness comes from ``genome.vary`` (equal to
    ``genome.score`` of the children, without a second pass over them).
    """
    jax = import_jax()

    gen_key = jax.random.fold_in(key, state.generation)
    children, fitness = _breed(gen_key, state, params, config, genome)
    return tell(state, children, fitness)


def evolve(
    key: Any, state: SearchState, params: Any, until: Any, config: SearchConfig, genome: Genome, length: int
) -> SearchState:
    """Run up to ``length`` generations in one loop, stopping at generation ``until``.

    Keys depend only on ``key`` and the generation number, so running G
    generations in one call or in chunks gives the same population.
    """
    jax = import_jax()
    import jax.numpy as jnp

    if length == 0:
        return state
    # The chunk's threefry draws and rankings, batched ahead of the loop (the
    # same numbers as step's, which draws them one generation at a time).
    size, n_genes = state.population.shape[0], state.population.shape[-1]
    generations = state.generation + jnp.arange(length, dtype=jnp.int32)
    bits = jax.vmap(lambda g: generation_bits(jax.random.fold_in(key, g), size, genome))(generations)
    ranks = jax.vmap(gene_rank, in_axes=(0, None))(bits, n_genes)

    start = state.generation
    stop = jnp.minimum(until, start + length)

    def generation(st: SearchState) -> SearchState:
        i = st.generation - start
        d = draws_from_bits(bits[i], ranks[i], n_genes, genome)
        return tell(st, *_breed_with(d, st, params, config, genome))

    return jax.lax.while_loop(lambda st: st.generation < stop, generation, state)
