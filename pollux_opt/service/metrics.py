"""The service's Prometheus metrics (``GET /metrics``), read from the store at each scrape.

Nothing is counted in memory: :class:`StoreCollector` turns the database
(:class:`~pollux_opt.service.db.Store`: the submissions and the index of the
event log) into metric families every time Prometheus scrapes, so that the
counters are the log's totals and survive a restart of the service, and the
series of a job disappear once it no longer holds workers.

The families (one ``pollux_`` prefix, base units, ``_total`` on counters):

* ``pollux_jobs{state}``: jobs in each lifecycle state (every state, 0 where none);
* ``pollux_job_submissions_total``: jobs ever submitted;
* ``pollux_job_completions_total{outcome}``: ended jobs by outcome (succeeded, failed, cancelled);
* ``pollux_job_completion_seconds``: histogram of an ended job's time from submission to its end;
* per job holding workers (label ``job``, its id): ``pollux_job_replicas``,
  ``pollux_job_batch_size`` (samples), ``pollux_job_goodput_samples_per_second``
  and ``pollux_job_speedup`` (goodput over the goodput of one replica at the initial batch size);
* ``pollux_cluster_cpus{state}``: the cluster's CPUs ``allocated`` to jobs and ``free``;
* ``pollux_round_decision_seconds``: histogram of the scheduler's decision time per round;
* ``pollux_round_objective``: the objective of the newest round.

prometheus_client is the ``service`` extra's; this module is imported only by the service.
"""

import bisect
from typing import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from pollux_opt.lifecycle import JobState
from pollux_opt.service.db import Store

__all__ = ["COMPLETION_BUCKETS_S", "DECISION_BUCKETS_S", "StoreCollector", "cpu_holders", "service_registry"]

#: Upper bounds (seconds) of the completion-time histogram: training jobs run
#: from under a minute (the quick examples) to about a day (the AdaptDL traces).
COMPLETION_BUCKETS_S = (10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
#: Upper bounds (seconds) of the decision-time histogram: a round's policy
#: decision takes milliseconds for a few jobs and up to the solver's time limit (tens of seconds) for many.
DECISION_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)
#: The states whose jobs hold workers (and so CPUs).
_HOLDING = tuple(s.value for s in JobState if s.holds_workers)
#: The terminal states: a job's outcome.
_OUTCOMES = tuple(s.value for s in JobState if s.terminal)


def cpu_holders(store: Store) -> dict[str, dict[str, int]]:
    """``{job id: {node: replicas}}`` of the jobs that hold CPUs now (running or rescaling)."""
    return {job["id"]: dict(job["placement"])
            for state in _HOLDING for job in store.jobs(state) if job["placement"]}


def _histogram(name: str, doc: str, values: Sequence[float], bounds: Sequence[float]) -> HistogramMetricFamily:
    """A histogram family of ``values`` with upper ``bounds`` (and +Inf)."""
    ordered = sorted(values)
    buckets = [(repr(float(b)), bisect.bisect_right(ordered, b)) for b in bounds]
    buckets.append(("+Inf", len(ordered)))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=float(sum(ordered)))


class StoreCollector:
    """A prometheus_client collector reading ``store`` at each scrape (see the module docstring).

    Args:
        store: the service's database.
        cluster_cpus: the cluster's CPUs, all nodes together.
    """

    def __init__(self, store: Store, cluster_cpus: int) -> None:
        self.store, self.cluster_cpus = store, int(cluster_cpus)

    def describe(self) -> Iterable[Metric]:
        """No families up front: registering the collector must not read the store."""
        return ()

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._live_jobs()
        yield from self._cluster()

    def _jobs(self) -> Iterator[Metric]:
        counts = self.store.counts()
        jobs = GaugeMetricFamily("pollux_jobs", "Jobs in each lifecycle state.", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], counts.get(state.value, 0))
        yield jobs
        yield CounterMetricFamily("pollux_job_submissions", "Jobs submitted since the state directory was made.",
                                  value=sum(counts.values()))
        ended = CounterMetricFamily("pollux_job_completions", "Ended jobs by outcome.", labels=["outcome"])
        for outcome in _OUTCOMES:
            ended.add_metric([outcome], counts.get(outcome, 0))
        yield ended
        marks = ", ".join("?" * len(_OUTCOMES))
        seconds = self.store.values(
            "SELECT j.end_t - s.submitted_unix FROM jobs j JOIN submissions s ON s.id = j.id "
            f"WHERE j.end_t IS NOT NULL AND j.state IN ({marks})", _OUTCOMES)
        yield _histogram("pollux_job_completion_seconds", "Seconds from a job's submission to its end (ended jobs).",
                         seconds, COMPLETION_BUCKETS_S)

    def _live_jobs(self) -> Iterator[Metric]:
        families = {
            "replicas": GaugeMetricFamily("pollux_job_replicas", "Replicas (CPUs) a job holds.", labels=["job"]),
            "batch_size": GaugeMetricFamily("pollux_job_batch_size", "A job's total batch size, samples.",
                                            labels=["job"]),
            "goodput": GaugeMetricFamily("pollux_job_goodput_samples_per_second",
                                         "A job's goodput, samples per second.", labels=["job"]),
            "speedup": GaugeMetricFamily("pollux_job_speedup",
                                         "A job's goodput over one replica's at its initial batch size.",
                                         labels=["job"]),
        }
        for state in _HOLDING:
            for job in self.store.jobs(state):
                for key, family in families.items():
                    if job.get(key) is not None:
                        family.add_metric([job["id"]], float(job[key]))
        yield from families.values()

    def _cluster(self) -> Iterator[Metric]:
        allocated = sum(sum(p.values()) for p in cpu_holders(self.store).values())
        cpus = GaugeMetricFamily("pollux_cluster_cpus", "The cluster's CPUs allocated to jobs and free.",
                                 labels=["state"])
        cpus.add_metric(["allocated"], allocated)
        cpus.add_metric(["free"], max(self.cluster_cpus - allocated, 0))
        yield cpus
        yield _histogram("pollux_round_decision_seconds", "Seconds the policy took to decide a round's allocation.",
                         self.store.values("SELECT solver_s FROM rounds"), DECISION_BUCKETS_S)
        last = self.store.last_round()
        if last is not None and last.get("objective") is not None:
            yield GaugeMetricFamily("pollux_round_objective", "The objective of the newest round's allocation.",
                                    value=float(last["objective"]))


def service_registry(store: Store, cluster_cpus: int) -> CollectorRegistry:
    """A new registry (never the global one) holding a :class:`StoreCollector` of ``store``."""
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, cluster_cpus))
    return registry
