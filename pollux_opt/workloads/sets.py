"""The built-in workload sets of real runs, :data:`WORKLOAD_SETS`, and their quick variants.

Each set mixes the runtime's built-in jobs (:mod:`pollux_opt.runtime.builtin_jobs`)
with staggered arrivals.  The submitted configurations are what a user would
plausibly pick by hand, not tuned to make any policy win: the built-in initial
batch size M0 or a small multiple of it, and one or two CPUs.

Each set has a *quick* variant (``load_workload(name, quick=True)``, see
:meth:`pollux_opt.workloads.job.Workload.quick`) sized so that ``pollux-opt
demo --quick`` runs all three policies on a 2-core machine in about six
minutes: arrivals compressed by :data:`~pollux_opt.workloads.job.QUICK_TIME_SCALE`
and each job's spec taken from its ``quick_spec`` below instead of ``spec``.

``hetero`` is sized for the ``local-hetero`` cluster
(:data:`pollux_opt.model.cluster_types.PRESETS`: one fast and one throttled
node of one CPU each): at most two jobs run at a time, so a policy decides
which job trains on the fast node.  It runs on any cluster (its jobs are the
built-in ones); only on a typed cluster do the policies see per-type models.

Targets: the full sets use each built-in job's own target or a harder one.
Measured on a shared 2-core machine at one CPU and the submitted batch size,
each built-in target takes 20 s or more of training co-adapted, plus 3-10 s
to start and 6-28 s to verify, depending on the load; the quick variants use
easier targets.
"""

from __future__ import annotations

from typing import Any, Mapping

from pollux_opt.workloads.job import Workload, WorkloadJob

__all__ = ["WORKLOAD_SETS"]

#: Quick ratings job: RMSE 0.60 (built-in 0.535), and Adam at 5e-4 instead of the
#: built-in ``RATINGS_LR`` (1.5e-4, chosen so that the full job trains for 20 s or
#: more): the higher rate keeps the quick job short.
RATINGS_QUICK: Mapping[str, Any] = {"target": 0.60, "config": {"lr": 5e-4}}
#: Quick character language model: validation loss 2.0 nats (built-in 1.60).
CHARLM_QUICK: Mapping[str, Any] = {"target": 2.0}
#: Quick digits classifier: accuracy 0.95 (built-in 0.98).
DIGITS_QUICK: Mapping[str, Any] = {"target": 0.95}
#: Quick regression job: MSE 0.13 (built-in 0.11) on 20k samples and a 64-wide MLP
#: (built-in 200k and 256): a few seconds of training, the scale of the quick demo.
REGRESS_QUICK: Mapping[str, Any] = {"target": 0.13, "config": {"samples": 20_000, "width": 64}}

#: The four jobs of the ``mixed`` and ``burst`` sets: id -> (kind, submitted
#: batch size, quick spec); each batch size is twice the kind's M0.
_FOUR_KINDS: dict[str, tuple[str, int, Mapping[str, Any]]] = {
    "ratings": ("ratings-mf", 512, RATINGS_QUICK),
    "charlm": ("stdlib-charlm", 128, CHARLM_QUICK),
    "digits": ("digits-cnn", 64, DIGITS_QUICK),
    "regress": ("synth-regress", 64, REGRESS_QUICK),
}


def _four_jobs(arrivals: Mapping[str, float], replicas: int) -> tuple[WorkloadJob, ...]:
    """The four jobs of :data:`_FOUR_KINDS`, in the order of ``arrivals`` (id -> seconds)."""
    return tuple(
        WorkloadJob(jid, _FOUR_KINDS[jid][0], t, replicas, _FOUR_KINDS[jid][1], quick_spec=_FOUR_KINDS[jid][2])
        for jid, t in arrivals.items()
    )


#: The named sets: name -> workload.
WORKLOAD_SETS: dict[str, Workload] = {w.name: w for w in (
    Workload(
        "mixed",
        _four_jobs({"ratings": 0.0, "charlm": 10.0, "digits": 30.0, "regress": 50.0}, replicas=1),
        "four different jobs arriving 10-20 s apart, each submitted on one CPU at a small multiple of its M0",
    ),
    Workload(
        "burst",
        _four_jobs({"ratings": 0.0, "charlm": 1.0, "regress": 2.0, "digits": 3.0}, replicas=2),
        "four jobs submitted within 3 s, each asking for two CPUs (the whole machine) at twice its M0",
    ),
    Workload("stream", (
        WorkloadJob("charlm-a", "stdlib-charlm", 0.0, 1, 64, spec={"target": 1.8}, quick_spec=CHARLM_QUICK),
        WorkloadJob("ratings-a", "ratings-mf", 20.0, 1, 256, quick_spec=RATINGS_QUICK),
        WorkloadJob("regress", "synth-regress", 40.0, 1, 32, spec={"target": 0.11}, quick_spec=REGRESS_QUICK),
        WorkloadJob("ratings-b", "ratings-mf", 60.0, 1, 1024, spec={"seed": 1},
                    quick_spec={**RATINGS_QUICK, "seed": 1}),
        WorkloadJob("charlm-b", "stdlib-charlm", 80.0, 1, 128, spec={"seed": 1},
                    quick_spec={**CHARLM_QUICK, "seed": 1}),
    ), "five jobs, two of them of the same kind with other seeds, arriving every 20 s on one CPU each"),
    Workload(
        "hetero",
        _four_jobs({"charlm": 0.0, "ratings": 2.0, "digits": 30.0, "regress": 45.0}, replicas=1),
        "four jobs on one CPU each for the two-node local-hetero cluster (one fast and one slow CPU): "
        "two arrive together and take both nodes, two more queue behind them",
    ),
)}
