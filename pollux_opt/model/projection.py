"""Throughput on node types a job has not run on: Sia's bootstrap projection.

On a heterogeneous cluster a job has one throughput model per node type
(statistical efficiency, from the gradient noise scale, is a property of the
job and its batch size, so it is shared by all types).  A new job has measured
nothing; Sia (Jayaram Subramanya et al., SOSP 2023, "bootstrapping throughput
models") first profiles it on one replica of every type, then estimates a
configuration of ``K`` replicas on a type ``A`` it has not run at that size
from the type ``B`` where it has::

    throughput(K, A) = throughput(1, A) / throughput(1, B) * throughput(K, B)

that is, the scaling curve measured on ``B`` carried over to ``A`` at A's
single-replica speed.  :func:`project_throughputs` applies it: measured rows
of ``A`` always win; ``B`` is the type with the most measured configurations
(ties: the largest measured replica count, then the name), as Sia projects
from the type it knows best.  The rule ignores that ``K`` replicas span a
different number of nodes on types with different node sizes (Sia's estimate
does the same); a measured row replaces the estimate as soon as one exists.

The speedup base that makes per-type speedups comparable is
:func:`pollux_opt.model.typed.speedup_base` (see ``docs/node-types.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from solvers import InvalidProblem

from pollux_opt.model.domains import shown
from pollux_opt.model.throughput import ThroughputParams

__all__ = ["bootstrap_ratio", "project_params", "project_throughputs", "projection_plan", "projection_source"]

#: Step-time parameters that are times (seconds or seconds per sample or
#: replica): a projection divides them by the speed ratio; ``gamma`` and
#: ``kappa`` are dimensionless and stay.
_TIME_PARAMS = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r")


def _positive(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidProblem(f"{what} must be a finite number > 0, got {shown(value)}")
    return float(value)


def _rows(type_name: str, rows: object) -> dict[int, float]:
    """``{replicas: throughput}`` of one type, checked."""
    if not isinstance(rows, Mapping):
        raise InvalidProblem(f"measured[{type_name!r}] must map replica counts to throughputs, got {shown(rows)}")
    out = {}
    for k, v in rows.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidProblem(f"measured[{type_name!r}] replica count must be an integer >= 1, got {shown(k)}")
        out[k] = _positive(f"measured[{type_name!r}][{k}]", v)
    return out


def bootstrap_ratio(one_replica: Mapping[str, float], target: str, source: str) -> float:
    """``throughput(1, target) / throughput(1, source)``: target's speed relative to source's.

    Args:
        one_replica: samples/s of the job on one replica of each profiled type.

    Raises:
        InvalidProblem: a type without its one-replica profile, or a non-positive throughput.
    """
    for t in (target, source):
        if t not in one_replica:
            raise InvalidProblem(
                f"type {t!r} has no one-replica profile (profiled: {sorted(one_replica)}); "
                "profile one replica of every type first"
            )
    a = _positive(f"one_replica[{target!r}]", one_replica[target])
    b = _positive(f"one_replica[{source!r}]", one_replica[source])
    return a / b


def projection_source(measured: Mapping[str, Mapping[int, float]], target: str) -> str | None:
    """The type the projection for ``target`` reads from: most measured replica
    counts beyond one, then the largest, then the name; None if no other type
    measured more than one replica."""
    best = None
    for t in sorted(measured):
        if t == target:
            continue
        rows = _rows(t, measured[t])
        multi = [k for k in rows if k > 1]
        if not multi:
            continue
        key = (len(multi), max(multi))
        if best is None or key > best[0]:
            best = (key, t)
    return None if best is None else best[1]


def project_throughputs(
    one_replica: Mapping[str, float], measured: Mapping[str, Mapping[int, float]], target: str
) -> dict[int, float]:
    """Throughput (samples/s) of the job on ``target`` by replica count: measured or projected.

    Args:
        one_replica: the job's one-replica throughput on each profiled type
            (it must include ``target`` and the source).
        measured: ``{type: {replicas: throughput}}`` of what the job has run
            (throughput at the best batch size of each configuration).
        target: the type to estimate.

    Returns:
        ``{replicas: throughput}``: ``target``'s measured rows, its one-replica
        throughput, and the source's other replica counts scaled by
        :func:`bootstrap_ratio`.

    Raises:
        InvalidProblem: ``target`` has no one-replica profile, or bad rows.
    """
    if target not in one_replica:
        raise InvalidProblem(
            f"type {target!r} has no one-replica profile (profiled: {sorted(one_replica)}); "
            "profile one replica of every type first"
        )
    base = _positive(f"one_replica[{target!r}]", one_replica[target])
    own = _rows(target, measured.get(target, {}))
    out = {1: base}
    source = projection_source(measured, target)
    if source is not None:
        ratio = bootstrap_ratio(one_replica, target, source)
        out.update({k: ratio * v for k, v in _rows(source, measured[source]).items() if k > 1})
    out.update(own)
    return dict(sorted(out.items()))


def project_params(source: ThroughputParams, ratio: float) -> ThroughputParams:
    """The step-time model of :func:`project_throughputs` at every configuration:
    ``source``'s model with every time divided by ``ratio`` (a
    :func:`bootstrap_ratio`), so that its throughput is ``ratio`` times the
    source's at every (nodes, replicas, batch).

    Pollux's step time is homogeneous of degree one in its times (compute and
    sync add, or combine as ``(a^g + b^g)^(1/g)``), so dividing them all by
    ``ratio`` divides the step time by ``ratio``.

    Raises:
        InvalidProblem: ``ratio`` not a finite number > 0.
    """
    if not isinstance(source, ThroughputParams):
        raise InvalidProblem(f"source must be a ThroughputParams, got {shown(source)}")
    r = _positive("ratio", ratio)
    values = {name: getattr(source, name) / r for name in _TIME_PARAMS}
    alpha_a = None if source.alpha_a is None else source.alpha_a / r
    return ThroughputParams(**values, gamma=source.gamma, alpha_a=alpha_a, kappa=source.kappa)


def _arrival_rows(type_name: str, one_replica: Mapping[str, float]) -> int:
    """Configurations of ``type_name`` that are its arrival profile (1 if it was profiled, else 0)."""
    return 1 if type_name in one_replica else 0


def projection_plan(
    types: tuple[str, ...] | list[str],
    replicas: Mapping[str, list[int] | tuple[int, ...]],
    fitted: frozenset[str] | set[str],
    one_replica: Mapping[str, float],
) -> dict[str, tuple[str, float]]:
    """Which type's throughput fit serves each type, and at what speed ratio.

    Args:
        types: the cluster's node types.
        replicas: ``{type: replica count of each measured configuration}``
            (a one-replica arrival profile counts as a configuration).
        fitted: the types with a fitted goodput model.
        one_replica: the job's one-replica throughput on each profiled type
            (samples/s; empty where the job was not profiled on arrival).

    Returns:
        ``{type: (source type, ratio)}``: the type's own fit with ratio 1 once
        the job has measured there beyond its arrival profile; else the fit of
        :func:`projection_source` (the type measured at the most replica counts
        beyond one) at :func:`bootstrap_ratio`; else its own fit of the arrival
        profile; else, for a type with no measurement at all, the fitted type
        with the most measured configurations (ties: the largest replica count,
        then the name).  The ratio is 1 where either type lacks an arrival
        profile: an unprofiled type is assumed as fast as the one it is
        projected from until its first measurement replaces the projection.
        Types with no fit to serve them are left out.
    """
    plan: dict[str, tuple[str, float]] = {}
    measured = {t: dict.fromkeys(r, 1.0) for t, r in replicas.items()}

    def ratio(target: str, source: str) -> float:
        if target in one_replica and source in one_replica:
            return bootstrap_ratio(one_replica, target, source)
        return 1.0

    for t in types:
        n = len(replicas.get(t, ()))
        if t in fitted and n > _arrival_rows(t, one_replica):
            plan[t] = (t, 1.0)
            continue
        if t not in fitted and n > 0:
            continue  # measured but not fitted yet: nothing stands for it
        source = projection_source(measured, t)
        if source is not None and source in fitted:
            plan[t] = (source, ratio(t, source))
        elif t in fitted:
            plan[t] = (t, 1.0)
        elif n == 0:
            best = max(((len(replicas.get(u, ())), max(replicas.get(u, ()), default=0), u)
                        for u in fitted if u != t), default=None)
            if best is not None:
                plan[t] = (best[2], ratio(t, best[2]))
    return plan
