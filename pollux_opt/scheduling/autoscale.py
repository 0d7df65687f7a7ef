"""Cluster autoscaling: how many nodes of each type are worth paying for, decided beside the allocation.

Pollux (Qiao et al., OSDI 2021, section 5.4) observes that the goodput model
that allocates a fixed cluster also sizes a cloud one: a node is worth its
price only while the jobs' *goodput* grows enough with it.  Throughput alone
keeps saying "more" far longer, since statistical efficiency falls as the
batch grows.  :class:`Autoscaler` turns the jobs' models into a desired node
count per type each round; a :class:`Provider` (the simulator's nodes,
Ray's autoscaler) brings the cluster there.  The allocation itself is still
the policy's, on the nodes that are up.

**The value of a cluster.**  Each active job ``j`` has a speedup curve
``s_j(k)``, its goodput on ``k`` slots of a type (at the batch it would choose
there; on as few nodes as hold them) over its one-slot goodput on the type
cheapest per slot, times its weight.  The curve is replaced by its upper
concave hull (a dip, e.g. at a node boundary, is bridged: the slots that pay
off only past it are valued at the chord's slope).  The value ``S(c)`` of
capacities ``c`` (slots per type) is ``max sum_j s_j(k_j)``, a job taking
slots of one type only, over ``sum_j k_j <= c_t`` per type: with one type,
exactly the sum of the ``c`` largest increments (the curves are concave);
with several, a local search over which type each job takes (each type's
value is again its largest increments), from every job on the type of its
largest first increment.  The search matters: where one type is fastest for
every job, a job that would do better on a slower type's many free slots
than on its share of the fast ones must be moved there, or no slower node
ever seems worth buying.

**The cost rule** (the default).  Paying for nodes and waiting for jobs
both cost: the cluster's cost rate is ``C = sum_t price_t n_t + lambda W``,
nodes at their price plus ``lambda`` (``time_value``) per second of each
active job's weight ``W``, and per unit of progress the cluster costs
``C / S``.  A node is added while it lowers that, i.e. while the value it
adds per unit of its price is at least the cluster's value per unit of cost,
``dS / price_t >= S / C``, and released once it no longer does.  Since both
the node-seconds and the job-seconds of a run are integrals of these rates
over its progress, choosing ``n`` to minimise ``C / S`` at every moment
minimises ``node-seconds + lambda job-seconds`` of the run (for one job
exactly, ignoring start-up and restarts); ``lambda`` picks the point on the
cost-time curve.  A node whose slots go to a job that already scales
nearly linearly is worth as much as the average, one that only grows a
saturated batch is not, and the bar rises with the cluster's value: the
threshold rule's fixed bar is both too low early in a job and too high
late.  Hysteresis: ``band`` (add at ``(1 + band)`` times the average,
release below ``(1 - band)`` times).

**The threshold rule** (Pollux's marginal-goodput rule, AdaptDL's utility
band; ``time_value=None``).  A node of type ``t`` is worth adding while each
slot of it adds at least ``grow_above`` to ``S`` per unit of price, and a
node is released once its slots add less than ``shrink_below`` (a band
between the two, so the size does not oscillate).

Units: a job's rate on one slot of the type cheapest per slot is 1, and a
price unit is that type's price per slot, so without prices ``grow_above =
0.5`` reads "add a node while each of its slots gives at least half of what
a slot gives a job that has none", and ``time_value = 32`` values a second of
a job at 32 slot-seconds.  Among types, the one whose extra value per unit
of price is highest is added first, and the one whose last node adds least
is released first (a tie: the cheaper is added, the dearer released).  Both
rules release nodes once the smaller size has been wanted for
``release_after`` seconds (default: the node start-up delay; the ski-rental
rule: hold an idle node for as long as getting it back would take).

**Throughput instead of goodput** (``rule="throughput"``; the baseline, after
Or et al., MLSys 2020, is it with the threshold rule: scale while throughput
per node stays above a fraction of its best): the same rules over throughput
curves, each job at its submitted per-replica batch, growing its total batch
with its replicas, no statistical efficiency.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model import Cluster, GoodputModel
from pollux_opt.model.domains import Choice, Integer, Real, check, check_fields, domain_field
from pollux_opt.scheduling.loop import JobView
from pollux_opt.scheduling.policies.flow_weights import hull_increments
from pollux_opt.scheduling.policies.views import compact_goodput, replica_cap

__all__ = [
    "node_prices",
    "DEFAULT_NODE_STARTUP_S",
    "DEFAULT_TIME_VALUE",
    "THRESHOLD_GROW",
    "Autoscaler",
    "Provider",
    "ScaleOptions",
    "ScaleRule",
    "cluster_value",
    "speedup_curves",
]

log = logging.getLogger(__name__)

#: Seconds from requesting a cloud node to its first replica: the middle of the
#: 60-300 s that cloud VMs with a GPU image typically take to boot and join.
DEFAULT_NODE_STARTUP_S = 120.0

#: The cost rule's default value of a second of one job, in slot-seconds of the
#: cheapest slot: measured (experiments/autoscale.py, docs/results.md), it keeps
#: completion times within a few percent of the throughput baseline's or a fixed
#: cluster's, and Pollux's cloud case (one ImageNet job, 16 x 4 at most) then
#: takes about a fifth fewer node-hours than the throughput baseline.
DEFAULT_TIME_VALUE = 32.0
#: The threshold rule's default bar: a node's slots each add half of a one-slot job's rate.
THRESHOLD_GROW = 0.5

#: Passes of :func:`cluster_value`'s local search over the jobs' types (each
#: pass tries every job on every other type; it stops earlier once none moves).
_SEARCH_PASSES = 4
#: A move of the local search must add at least this much value (float noise).
_MOVE_GAIN = 1e-9

#: A node type's price per node-hour (any currency; only ratios matter to the rule).
_PRICE = Real(gt=0, finite=True)


class ScaleRule(str, enum.Enum):
    """What a node's worth is measured in."""

    #: Goodput: throughput times statistical efficiency at the batch each job would choose.
    GOODPUT = "goodput"
    #: Throughput at each job's submitted per-replica batch (weak scaling).
    THROUGHPUT = "throughput"


@dataclass(frozen=True)
class ScaleOptions:
    """How an :class:`Autoscaler` sizes the cluster.

    Attributes:
        min_nodes: nodes kept whatever the load (of the cheapest type per slot).
        max_nodes: most nodes in all (None: every node of the largest cluster).
        rule: what a node is worth in: ``goodput`` (the default) or
            ``throughput`` (the baseline's).
        time_value: the cost rule's ``lambda``: a second of an active job
            (of weight 1) is worth this many seconds of the cheapest slot
            (see the module docstring); None: the threshold rule.
        band: the cost rule's hysteresis, a fraction of the cluster's value
            per unit of cost.
        grow_above: the threshold rule's bar (with ``time_value=None``; None:
            :data:`THRESHOLD_GROW`): a node is added while each of its slots
            adds at least this much value per price unit.
        shrink_below: the threshold rule's: a node is released once its
            slots add less than this (at most ``grow_above``; None: half of
            it).
        startup_s: seconds from a node's request to its first replica.
        release_after: seconds a smaller size must be wanted before nodes are
            released (None: ``startup_s``).
    """

    min_nodes: int = domain_field(1, Integer(ge=1))
    max_nodes: int | None = domain_field(None, Integer(ge=1, none=True))
    rule: str = domain_field(ScaleRule.GOODPUT.value, Choice(tuple(r.value for r in ScaleRule)))
    time_value: float | None = domain_field(DEFAULT_TIME_VALUE, Real(ge=0, finite=True, none=True))
    band: float = domain_field(0.1, Real(ge=0, lt=1))
    grow_above: float | None = domain_field(None, Real(gt=0, finite=True, none=True))
    shrink_below: float | None = domain_field(None, Real(ge=0, finite=True, none=True))
    startup_s: float = domain_field(DEFAULT_NODE_STARTUP_S, Real(ge=0, finite=True, unit="seconds"))
    release_after: float | None = domain_field(None, Real(ge=0, finite=True, none=True, unit="seconds"))

    def __post_init__(self) -> None:
        if isinstance(self.rule, ScaleRule):
            object.__setattr__(self, "rule", self.rule.value)
        check_fields(self, prefix="autoscale ")
        if self.max_nodes is not None and self.max_nodes < self.min_nodes:
            raise InvalidProblem(f"autoscale max_nodes must be at least min_nodes ({self.min_nodes}), "
                                 f"got {self.max_nodes}")
        threshold = self.grow_above is not None or self.shrink_below is not None
        if threshold and self.time_value is not None:
            raise InvalidProblem(f"autoscale grow_above and shrink_below are the threshold rule's: give "
                                 f"time_value=None with them, got time_value={self.time_value:g}")
        if self.time_value is None:
            grow = THRESHOLD_GROW if self.grow_above is None else self.grow_above
            object.__setattr__(self, "grow_above", grow)
            if self.shrink_below is None:
                object.__setattr__(self, "shrink_below", grow / 2)
        if threshold and self.shrink_below > self.grow_above:
            raise InvalidProblem(f"autoscale shrink_below must be at most grow_above ({self.grow_above:g}), "
                                 f"got {self.shrink_below:g}")

    @property
    def hold_s(self) -> float:
        """Seconds a smaller size must be wanted before nodes go."""
        return self.startup_s if self.release_after is None else self.release_after


@runtime_checkable
class Provider(Protocol):
    """Where nodes come from (the simulator's, Ray's autoscaler): what a backend
    offers the scheduler loop to autoscale it."""

    def current_cluster(self) -> Cluster:
        """The nodes that take replicas now (up, not being released)."""
        ...

    def provisioned(self) -> dict[str, int]:
        """Nodes per type requested and not being released (up or starting)."""
        ...

    def provision(self, now: float, sizes: Mapping[str, int]) -> None:
        """Bring the cluster towards ``sizes`` nodes per type."""
        ...


def node_prices(prices: Mapping[str, float] | None, cluster: Cluster) -> dict[str, float]:
    """Price per node-hour of each type of ``cluster`` (1 where ``prices`` has none).

    Raises:
        InvalidProblem: ``prices`` is not a mapping of the cluster's types to positive numbers.
    """
    if prices is not None and not isinstance(prices, Mapping):
        raise InvalidProblem(f"prices must be a mapping of node types to prices per node-hour, got {prices!r}")
    for t, price in (prices or {}).items():
        if t not in cluster.types:
            raise InvalidProblem(f"prices name node type {t!r}, which the cluster lacks; its types: "
                                 f"{list(cluster.types)}")
        check(f"prices[{t!r}]", price, _PRICE)
    return {t: float((prices or {}).get(t, 1.0)) for t in cluster.types}


def _model_of(view: JobView, node_type: str) -> GoodputModel | None:
    models = view.goodput_models or {}
    return models.get(node_type, view.goodput_model)


def _rates(view: JobView, model: GoodputModel, ks: np.ndarray, node_slots: int, rule: ScaleRule) -> np.ndarray:
    """The job's rate (M0-samples / s for goodput, samples / s for throughput) at each k in ``ks``."""
    if rule is ScaleRule.THROUGHPUT:
        local = max(1, view.submitted_batch_size // max(view.submitted_replicas, 1))
        local = min(local, model.limits.max_local_bsz)
        return np.asarray(model.throughput(-(-ks // node_slots), ks, local), dtype=float)
    return compact_goodput(model, ks, node_slots, view.fixed_batch_size)


def speedup_curves(views: Sequence[JobView], cluster: Cluster, rule: ScaleRule | str = ScaleRule.GOODPUT,
                   *, reference: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Each job's hull increments per node type of ``cluster`` (the largest cluster).

    Returns ``{job id: {type: float64[K]}}``: the value the job's k-th slot of
    that type adds (weighted, in units of the job's one-slot rate on the
    ``reference`` type, or on its best type where that is None or the job
    cannot run there), K at most
    :func:`~pollux_opt.scheduling.policies.views.replica_cap` on that type's
    nodes.  A job without a model scales linearly (Pollux's prior).
    """
    rule = ScaleRule(rule)
    out: dict[str, dict[str, np.ndarray]] = {}
    for view in views:
        raw: dict[str, np.ndarray] = {}
        for t in cluster.types:
            nodes = cluster.of_type(t)
            typed = Cluster(nodes) if cluster.typed else cluster
            cap = replica_cap(view, typed)
            model = _model_of(view, t)
            ks = np.arange(1, cap + 1)
            if model is None or cap < 1:
                raw[t] = ks.astype(float)
            else:
                raw[t] = _rates(view, model, ks, max(n.cpus for n in nodes), rule)
        ref = raw.get(reference, ())
        best = ref[0] if len(ref) and ref[0] > 0 else max((r[0] for r in raw.values() if len(r) and r[0] > 0),
                                                         default=0.0)
        if best <= 0:
            continue  # nothing fits anywhere: no slot is worth anything to it
        out[view.job_id] = {t: float(view.weight) * hull_increments(np.concatenate([[0.0], r / best]))
                            for t, r in raw.items()}
    return out


def _top_sum(increments: Sequence[np.ndarray], slots: int) -> float:
    """The sum of the ``slots`` largest of ``increments`` (arrays, concatenated)."""
    if slots <= 0 or not increments:
        return 0.0
    inc = np.concatenate(increments)
    if inc.size <= slots:
        return float(inc.sum())
    return float(np.partition(inc, inc.size - slots)[inc.size - slots:].sum())


def cluster_value(curves: Mapping[str, Mapping[str, np.ndarray]], slots: Mapping[str, int]) -> float:
    """``S(slots)``: the value of ``slots`` per type to the jobs of ``curves``, each
    job on one type (see the module docstring: exact for one type, a local search
    over the jobs' types for several)."""
    types = [t for t, c in slots.items() if c > 0]
    options = {j: [t for t in types if len(c.get(t, ()))] for j, c in curves.items()}
    options = {j: ts for j, ts in options.items() if ts}
    if len(types) == 1:
        (t,) = types
        return _top_sum([curves[j][t] for j in options], slots[t])
    assign = {j: max(ts, key=lambda t: curves[j][t][0]) for j, ts in options.items()}
    members = {t: {j for j in assign if assign[j] == t} for t in types}

    def value(t: str, jobs) -> float:
        return _top_sum([curves[j][t] for j in sorted(jobs)], slots[t])

    values = {t: value(t, members[t]) for t in types}
    for _ in range(_SEARCH_PASSES):
        moved = False
        for j, ts in options.items():
            here = assign[j]
            left = value(here, members[here] - {j})
            gains = {t: left + value(t, members[t] | {j}) - values[here] - values[t] for t in ts if t != here}
            to = max(gains, key=gains.get, default=None)
            if to is None or gains[to] <= _MOVE_GAIN:
                continue
            values[to] += gains[to] + values[here] - left
            values[here] = left
            members[here].discard(j)
            members[to].add(j)
            assign[j] = to
            moved = True
        if not moved:
            break
    return float(sum(values.values()))


class Autoscaler:
    """Decides a desired node count per type each round (see the module docstring).

    Args:
        cluster: the largest cluster (its nodes per type bound each type's count).
        options: the rule and its settings.
        prices: price per node-hour of each node type (None, or a type left
            out: 1).

    Raises:
        InvalidProblem: ``min_nodes`` above the cluster's nodes, or a price
            that is not a positive number.
    """

    def __init__(self, cluster: Cluster, options: ScaleOptions | None = None, *,
                 prices: Mapping[str, float] | None = None) -> None:
        self.options = options or ScaleOptions()
        self.prices = node_prices(prices, cluster)
        self.cluster = cluster
        self.slots = {t: max(n.cpus for n in cluster.of_type(t)) for t in cluster.types}
        self.most = {t: len(cluster.of_type(t)) for t in cluster.types}
        self.max_nodes = min(self.options.max_nodes or len(cluster.nodes), len(cluster.nodes))
        if self.options.min_nodes > self.max_nodes:
            raise InvalidProblem(f"autoscale min_nodes must be at most the cluster's {self.max_nodes} nodes, "
                                 f"got {self.options.min_nodes}")
        slot_price = {t: self.prices[t] / self.slots[t] for t in cluster.types}
        cheapest = min(slot_price.values())
        #: A node's price in price units (the cheapest slot's price).
        self.units = {t: self.prices[t] / cheapest for t in cluster.types}
        self._cheap = sorted(cluster.types, key=lambda t: (slot_price[t], cluster.types.index(t)))
        self._smaller_since: float | None = None

    def initial(self) -> dict[str, int]:
        """The sizes to start with: ``min_nodes``, of the cheapest types per slot."""
        sizes, left = {t: 0 for t in self.cluster.types}, self.options.min_nodes
        for t in self._cheap:
            sizes[t] = min(left, self.most[t])
            left -= sizes[t]
        return sizes

    def _value(self, curves, sizes: Mapping[str, int]) -> float:
        return cluster_value(curves, {t: sizes[t] * self.slots[t] for t in sizes})

    def _neighbours(self, curves, sizes: dict[str, int], types, step: int) -> dict[str, float]:
        """The value of ``sizes`` with one node of each of ``types`` added (``step`` 1) or taken away (-1)."""
        return {t: self._value(curves, {**sizes, t: sizes[t] + step}) for t in types}

    def _bar(self, sizes: Mapping[str, int], value: float, weight: float, side: int) -> float:
        """The value per price unit a node must add to be added (``side`` 1) or kept
        (-1, ``sizes`` without it, whose value is ``value``): the threshold rule's bar,
        or the cost rule's ``(1 +- band) S / C``."""
        o = self.options
        if o.time_value is None:
            return o.grow_above if side > 0 else o.shrink_below
        cost = sum(self.units[t] * n for t, n in sizes.items()) + o.time_value * weight
        average = value / cost if cost > 0 else 0.0
        return (1 + side * o.band) * average

    def target(self, views: Sequence[JobView], sizes: Mapping[str, int]) -> dict[str, int]:
        """The sizes the rule points to from ``sizes``, ignoring the release hold."""
        o = self.options
        curves = speedup_curves(views, self.cluster, o.rule, reference=self._cheap[0])
        weight = sum(float(v.weight) for v in views if v.job_id in curves)
        sizes = {t: int(sizes.get(t, 0)) for t in self.cluster.types}
        here = self._value(curves, sizes)
        grown = False
        while sum(sizes.values()) < self.max_nodes:
            room = [t for t in self.cluster.types if sizes[t] < self.most[t]]
            more = self._neighbours(curves, sizes, room, +1)
            gains = {t: abs(more[t] - here) / self.units[t] for t in room}  # per price unit
            best = max(gains, key=lambda t: (gains[t], -self.units[t]), default=None)  # a tie: the cheaper
            if best is None or gains[best] <= 0 or gains[best] < self._bar(sizes, here, weight, +1):
                break
            sizes[best] += 1
            here = more[best]
            grown = True
        while not grown and sum(sizes.values()) > o.min_nodes:
            held = [t for t in self.cluster.types if sizes[t] > 0]
            fewer = self._neighbours(curves, sizes, held, -1)
            losses = {t: abs(here - fewer[t]) / self.units[t] for t in held}
            worst = min(losses, key=lambda t: (losses[t], -self.units[t]))  # a tie: the dearer goes
            smaller = {**sizes, worst: sizes[worst] - 1}
            if losses[worst] > 0 and losses[worst] >= self._bar(smaller, fewer[worst], weight, -1):
                break
            sizes = smaller
            here = fewer[worst]
        return sizes

    def decide(self, now: float, views: Sequence[JobView], sizes: Mapping[str, int]) -> dict[str, int]:
        """The desired nodes per type at ``now`` (seconds), from the ``sizes`` provisioned now.

        Growth is immediate; a smaller size is taken once it has been wanted
        for :attr:`ScaleOptions.hold_s` seconds."""
        sizes = {t: int(sizes.get(t, 0)) for t in self.cluster.types}
        want = self.target(views, sizes)
        if all(want[t] >= sizes[t] for t in want):  # the same size, or larger: at once
            self._smaller_since = None
            return want
        if self._smaller_since is None:
            self._smaller_since = now
        if now - self._smaller_since < self.options.hold_s:
            return sizes
        self._smaller_since = None
        return want
