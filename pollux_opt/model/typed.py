"""A job's goodput models on a heterogeneous cluster: one per node type, one speedup base.

A job has one throughput model per node type (fitted to its measurements on
that type, or projected from another type, :mod:`pollux_opt.model.projection`)
and one statistical efficiency (its gradient noise scale does not depend on
the device), so its per-type :class:`~pollux_opt.model.GoodputModel` s share
their :class:`~pollux_opt.model.GradientStats` and differ in throughput and
batch limits (a type's device memory caps the per-replica batch).

Speedups on every type are divided by one number so that they compare across
types: with per-type weights (a scheduler gives each type's GPUs in the
cluster), the weighted mean of the job's goodputs at its base shape on each
type, the goodput of a fair share of the whole cluster; without, the lowest of
them (:func:`speedup_base`).  With one type either is
the base of the single-type model (see ``docs/node-types.md``, section 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

from solvers import InvalidProblem

from pollux_opt.model.domains import Real, check, shown
from pollux_opt.model.goodput import GoodputModel

__all__ = ["TypedGoodput", "TypedTable", "speedup_base"]

#: Cached base goodputs: a scheduler asks for the same models' bases every round.
_CACHE_SIZE = 4096
#: A goodput, samples/s x efficiency.
_POSITIVE = Real(gt=0)


@dataclass(frozen=True)
class TypedGoodput:
    """Goodput models of one job per node type, with the base shape on each type.

    Attributes:
        models: ``((type, model), ...)``, one per type the job may run on.
        bases: ``((type, (nodes, replicas)), ...)``: the base allocation on each
            type (e.g. a fair share); the speedup base is the lowest goodput
            over these (:meth:`base_goodput`).
        factors: ``((type, factor), ...)``: a multiplier in (0, 1] on every
            speedup of that type (default 1), e.g. the price of moving a
            running job to another type; the base is not affected.
        weights: ``((type, weight), ...)``: each type's weight (> 0) in the
            speedup base, e.g. its GPUs in the cluster (:meth:`base_goodput`);
            empty: the base is the lowest goodput over the types.  Given, it
            must name every type of ``models``.

    Build it with :meth:`of` from mappings.  Frozen and hashable (tuples), so
    encodings can be cached by it.
    """

    models: tuple[tuple[str, GoodputModel], ...]
    bases: tuple[tuple[str, tuple[int, int]], ...]
    factors: tuple[tuple[str, float], ...] = ()
    weights: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple((str(t), m) for t, m in self.models))
        object.__setattr__(self, "bases", tuple((str(t), (int(b[0]), int(b[1]))) for t, b in self.bases))
        object.__setattr__(self, "factors", tuple((str(t), float(f)) for t, f in self.factors))
        object.__setattr__(self, "weights", tuple((str(t), float(w)) for t, w in self.weights))
        for t, f in self.factors:
            if not 0.0 < f <= 1.0:
                raise InvalidProblem(f"factor of type {t!r} must be in (0, 1], got {f!r}")
        for t, w in self.weights:
            if not 0.0 < w < math.inf:
                raise InvalidProblem(f"weight of type {t!r} must be a finite number > 0, got {w!r}")
        if not self.models:
            raise InvalidProblem("typed goodput models must name at least one type, got none")
        for t, m in self.models:
            if not isinstance(m, GoodputModel):
                raise InvalidProblem(f"model of type {t!r} must be a GoodputModel, got {shown(m)}")
        names = [t for t, _ in self.models]
        if len(set(names)) != len(names):
            raise InvalidProblem(f"typed goodput models name a type twice: {names}")
        missing = sorted(set(names) - {t for t, _ in self.bases})
        if missing:
            raise InvalidProblem(f"type {missing[0]!r} has a model but no base allocation")
        unweighted = sorted(set(names) - {t for t, _ in self.weights}) if self.weights else []
        if unweighted:
            raise InvalidProblem(f"type {unweighted[0]!r} has a model but no weight in the speedup base")
        for t, (nn, k) in self.bases:
            if nn < 1 or k < nn:
                raise InvalidProblem(f"base of type {t!r} needs 1 <= num_nodes <= num_replicas, got {(nn, k)}")

    @classmethod
    def of(cls, models: Mapping[str, GoodputModel], bases: Mapping[str, tuple[int, int]],
           factors: Mapping[str, float] | None = None,
           weights: Mapping[str, float] | None = None) -> "TypedGoodput":
        """From ``{type: model}``, ``{type: (nodes, replicas)}`` and optional
        ``{type: factor}`` and ``{type: weight}`` (types in ``models``' order)."""
        factors = {} if factors is None else factors
        weights = {} if weights is None else weights
        if not all(isinstance(m, Mapping) for m in (models, bases, factors, weights)):
            raise InvalidProblem(f"models, bases, factors and weights must be mappings by type, got "
                                 f"{shown(models)}, {shown(bases)}, {shown(factors)}, {shown(weights)}")
        return cls(tuple(models.items()), tuple((t, tuple(bases[t])) for t in models if t in bases),
                   tuple((t, factors[t]) for t in models if t in factors),
                   tuple((t, weights[t]) for t in models if t in weights))

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.models)

    def model(self, type_name: str) -> GoodputModel | None:
        """The model on ``type_name`` (None: the job has none there)."""
        return dict(self.models).get(type_name)

    def base(self, type_name: str) -> tuple[int, int]:
        return dict(self.bases)[type_name]

    def factor(self, type_name: str) -> float:
        """The multiplier on the job's speedups on ``type_name`` (1 unless set)."""
        return dict(self.factors).get(type_name, 1.0)

    def base_goodput(self, fixed_batch_size: int | None = None, types: tuple[str, ...] | None = None) -> float:
        """The speedup base, samples/s x efficiency: over ``types`` (default: all
        the job's types), the mean of the best goodputs at each type's base
        shape weighted by :attr:`weights`, or without weights the lowest of them.

        With a type's GPUs as its weight and a fair share as the base shape,
        the weighted mean is the goodput of an exclusive ``1 / J`` share of
        the whole cluster, which holds ``1 / J`` of every type's GPUs (for
        linear scaling exactly; Pollux's fair-share base, OSDI 2021, section
        4.2, on a cluster of several types).  A type where the base shape has
        no feasible batch is left out (its weight with it).

        Raises:
            InvalidProblem: no type has a feasible base.
        """
        key = replace(self, factors=()) if self.factors else self  # factors do not move the base
        return _base_goodput(key, fixed_batch_size, self.types if types is None else tuple(types))


@dataclass(frozen=True)
class TypedTable:
    """Explicit speedup tables of one job per node type (speedups already on one base).

    Attributes:
        tables: ``((type, ((num_nodes, num_replicas, speedup), ...)), ...)``;
            build it with :meth:`of` from ``{type: {(num_nodes, num_replicas): speedup}}``.
            :class:`~pollux_opt.model.Job` checks every table as it checks an untyped one.
    """

    tables: tuple[tuple[str, tuple[tuple[int, int, float], ...]], ...]

    @classmethod
    def of(cls, tables: Mapping[str, Mapping[tuple[int, int], float]]) -> "TypedTable":
        if not isinstance(tables, Mapping) or not all(isinstance(t, Mapping) for t in tables.values()):
            raise InvalidProblem(f"typed speedup tables must map each type to a table, got {shown(tables)}")
        return cls(tuple((str(t), tuple((k[0], k[1], s) for k, s in table.items())) for t, table in tables.items()))

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.tables)

    def table(self, type_name: str) -> dict[tuple[int, int], float] | None:
        """``{(num_nodes, num_replicas): speedup}`` on ``type_name`` (None: the job does not run there)."""
        rows = dict(self.tables).get(type_name)
        return None if rows is None else {(n, k): s for n, k, s in rows}


@lru_cache(maxsize=_CACHE_SIZE)
def _base_goodput(typed: TypedGoodput, fixed_batch_size: int | None, types: tuple[str, ...]) -> float:
    at_share = {}
    for t in types:
        model = typed.model(t)
        if model is None:
            continue
        nn, k = typed.base(t)
        choice = model.optimize(nn, k, fixed_batch_size=fixed_batch_size)
        if bool(choice.feasible):
            at_share[t] = float(choice.goodput)
    if not at_share:
        raise InvalidProblem(f"no type of {list(types)} has a feasible base allocation for this job")
    if typed.weights:
        weight = dict(typed.weights)
        return sum(weight[t] * g for t, g in at_share.items()) / sum(weight[t] for t in at_share)
    return speedup_base(at_share)[1]


def speedup_base(goodput_at_share: Mapping[str, float]) -> tuple[str, float]:
    """``(type, goodput)`` of the lowest fair-share goodput over the types: the speedup base.

    ``goodput_at_share[t]`` is the job's goodput (samples/s x efficiency) at its
    fair-share shape on type ``t``.  Dividing every type's goodputs by the
    lowest keeps all speedups comparable and >= 1 at the fair share on any
    type, like Sia's minimum normalisation; with one type it is that type's
    fair-share goodput, the base of the single-type model.

    Raises:
        InvalidProblem: no types, or a non-positive goodput.
    """
    if not goodput_at_share:
        raise InvalidProblem("goodput_at_share must name at least one type, got {}")
    values = {t: float(check(f"goodput_at_share[{t!r}]", v, _POSITIVE)) for t, v in goodput_at_share.items()}
    t = min(values, key=lambda name: (values[name], name))
    return t, values[t]
