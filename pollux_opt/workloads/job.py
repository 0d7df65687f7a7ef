"""A workload: training jobs with arrival times and the configurations their users submitted.

One :class:`WorkloadJob` type serves real runs and simulations alike:

* real runs (:mod:`pollux_opt.backends.local`): ``kind`` names a registered
  runtime job (e.g. ``"stdlib-charlm"``), optionally with changed spec fields
  (``spec``, such as the target) and the fields of its quick variant
  (``quick_spec``); a :class:`Workload` groups them under a name, and
  :func:`pollux_opt.workloads.load.load_workload` reads one by name or from a
  JSON file::

      {"name": "my-set", "description": "...",
       "jobs": [{"id": "lm-1", "kind": "stdlib-charlm", "arrival_s": 0,
                 "replicas": 1, "batch_size": 128,
                 "max_replicas": 4, "spec": {"target": 1.8}}]}

  A workload file is code: its optional ``"imports": ["my_jobs"]`` are
  imported when it is read (they register their job kinds), and only those
  modules' and the built-in jobs' builders may be named by a job's ``spec``
  (see the trust model of :mod:`pollux_opt.runtime.spec`).

* simulations (:mod:`pollux_opt.backends.sim`): ``kind`` names a profile
  (an application of the AdaptDL traces, e.g. ``"cifar10"``); the AdaptDL
  workload CSVs are read into these jobs by
  :func:`pollux_opt.workloads.adaptdl.read_adaptdl_csv`.

The submitted ``replicas`` and ``batch_size`` are what the non-adaptive
policies run (``fixed``; ``dynamic`` keeps the batch size; the AdaptDL CSVs
hold the users' tuned configurations).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from solvers import InvalidProblem

from pollux_opt.model.domains import NAME, REQUIRED, Integer, Real, check_fields, domain_field
from pollux_opt.model.job import WEIGHT

__all__ = ["QUICK_TIME_SCALE", "Workload", "WorkloadJob", "builtin_spec"]

#: Factor applied to arrival times in quick variants (project choice: keeps the
#: arrival order and the overlap of jobs while shortening the run).
QUICK_TIME_SCALE = 0.5

#: Replica counts and batch sizes a user submits.
_POSITIVE_COUNT = Integer(ge=1)
_FIELDS = ("id", "kind", "arrival_s", "replicas", "batch_size", "min_replicas", "max_replicas", "spec", "quick_spec",
           "entry", "import_dir", "weight")
_REQUIRED = _FIELDS[:5]


def builtin_spec(kind: str):
    """The registered :class:`~pollux_opt.runtime.spec.JobSpec` named ``kind``."""
    from pollux_opt.runtime.entry import get_job

    return get_job(kind)


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload.

    Attributes:
        id: unique id within the workload (letters, digits, '.', '_', '-').
        kind: what the job is: a registered runtime job (real runs, e.g.
            ``"stdlib-charlm"``) or a profile name (simulations, e.g. ``"cifar10"``).
        arrival_s: submission time, seconds after the run starts.
        replicas: CPUs (simulations: GPUs) the user submitted the job with.
        batch_size: total batch size (samples) the user submitted it with.
        min_replicas: smallest replica count the job accepts when running (>= 1).
        max_replicas: largest replica count it accepts (None: the cluster's size).
        spec: changed :class:`~pollux_opt.runtime.spec.JobSpec` fields (real
            runs, e.g. ``{"target": 1.8}``).
        quick_spec: spec fields used instead of ``spec`` in the quick variant.
        entry: a user's job instead of a registered kind (real runs):
            ``"script.py:function"`` or ``"package.module:function"``, imported
            from ``import_dir``; ``kind`` is then the job's name and ``spec``
            gives its fields (see :mod:`pollux_opt.runtime.entry` and
            ``docs/user-jobs.md``).
        import_dir: the directory an entry is imported from (absolute; default:
            the current directory; a workload file's loader sets its own directory).
        weight: the job's priority (in ``solvers.WEIGHT_RANGE``, 1 by default): its
            weight in the allocator-driven policies' objectives (``pollux``,
            ``fair-jct``), where a job of weight w counts as w jobs of weight 1.
    """

    id: str = domain_field(REQUIRED, NAME)
    kind: str = domain_field(REQUIRED, NAME)
    arrival_s: float = domain_field(REQUIRED, Real(ge=0))
    replicas: int = domain_field(REQUIRED, _POSITIVE_COUNT)
    batch_size: int = domain_field(REQUIRED, _POSITIVE_COUNT)
    min_replicas: int = domain_field(1, _POSITIVE_COUNT)
    max_replicas: int | None = domain_field(None, Integer(ge=1, none=True))
    spec: Mapping[str, Any] = field(default_factory=dict)
    quick_spec: Mapping[str, Any] | None = None
    entry: str | None = None
    import_dir: str | None = None
    weight: float = domain_field(1.0, WEIGHT)

    def __post_init__(self) -> None:
        check_fields(self, prefix="job ", names=("id",))
        prefix = f"job {self.id!r}: "
        check_fields(self, prefix=prefix)
        object.__setattr__(self, "arrival_s", float(self.arrival_s))
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise InvalidProblem(
                f"{prefix}max_replicas must be >= min_replicas ({self.min_replicas}), got {self.max_replicas!r}"
            )
        for name in ("spec", "quick_spec"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, Mapping):
                raise InvalidProblem(f"{prefix}{name} must be a mapping of JobSpec fields, got {v!r}")
        object.__setattr__(self, "spec", dict(self.spec))
        if self.entry is not None:
            object.__setattr__(self, "import_dir", os.path.abspath(self.import_dir or os.getcwd()))
        if self.quick_spec is not None:
            object.__setattr__(self, "quick_spec", dict(self.quick_spec))

    def job_spec(self):
        """The :class:`~pollux_opt.runtime.spec.JobSpec` this job runs (the kind's spec with ``spec`` applied).

        Raises:
            InvalidProblem: an unknown kind, or a ``builder`` in ``spec`` that is
                not from a declared module (the trust model of
                :mod:`pollux_opt.runtime.spec`: the workload's ``imports``).
        """
        from pollux_opt.runtime.spec import check_declared_builder

        if self.entry is not None:
            from pollux_opt.runtime.entry import entry_spec

            return entry_spec(self.entry, self.import_dir, name=self.kind, fields=self.spec,
                              where=f"workload job {self.id!r}")
        base = builtin_spec(self.kind)
        if self.spec.get("builder", base.builder) != base.builder:
            check_declared_builder(self.spec["builder"], where=f"workload job {self.id!r}")
        return base.replace(**self.spec) if self.spec else base

    def to_json(self) -> dict:
        out = {
            "id": self.id, "kind": self.kind, "arrival_s": self.arrival_s, "replicas": self.replicas,
            "batch_size": self.batch_size, "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas, "spec": dict(self.spec), "weight": self.weight,
        }
        if self.quick_spec is not None:
            out["quick_spec"] = dict(self.quick_spec)
        if self.entry is not None:
            out["entry"], out["import_dir"] = self.entry, self.import_dir
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WorkloadJob":
        if not isinstance(data, Mapping):
            raise InvalidProblem(f"a workload job must be an object, got {data!r}")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise InvalidProblem(f"workload job {data.get('id')!r}: unknown field(s) {unknown}")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise InvalidProblem(f"workload job {data.get('id')!r}: missing field(s) {missing}")
        return cls(**{k: (v if k != "spec" else (v or {})) for k, v in data.items()})


@dataclass(frozen=True)
class Workload:
    """A named set of jobs (ids unique), see the module docstring.

    Attributes:
        name: letters, digits, '.', '_', '-' (a safe file name).
        jobs: the jobs.
        description: one line for humans.
        imports: modules imported when the workload is created (they register
            the job kinds it uses), whose builders its jobs' ``spec`` may name;
            a workload file is code (see :mod:`pollux_opt.runtime.spec`).
    """

    name: str = domain_field(REQUIRED, NAME)
    jobs: tuple[WorkloadJob, ...]
    description: str = ""
    imports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, prefix="workload ")
        imports = self.imports
        if isinstance(imports, str) or not isinstance(imports, (list, tuple)):
            raise InvalidProblem(f"workload imports must be a list of module names, got {imports!r}")
        object.__setattr__(self, "imports", tuple(imports))
        object.__setattr__(self, "jobs", tuple(self.jobs))
        if not self.jobs:
            raise InvalidProblem(f"workload {self.name!r} has no jobs")
        seen: set[str] = set()
        for job in self.jobs:
            if not isinstance(job, WorkloadJob):
                raise InvalidProblem(f"workload jobs must be WorkloadJob, got {job!r}")
            if job.id in seen:
                raise InvalidProblem(f"workload {self.name!r}: duplicate job id {job.id!r}")
            seen.add(job.id)
        if self.imports:  # last: nothing is imported for a workload refused above
            from pollux_opt.runtime.spec import declare_builder_modules

            declare_builder_modules(self.imports, import_them=True)

    def quick(self) -> "Workload":
        """The quick variant: arrivals scaled by :data:`QUICK_TIME_SCALE`, ``quick_spec`` fields used."""
        jobs = tuple(
            replace(j, arrival_s=j.arrival_s * QUICK_TIME_SCALE,
                    spec=j.spec if j.quick_spec is None else j.quick_spec, quick_spec=None)
            for j in self.jobs
        )
        return Workload(f"{self.name}-quick", jobs, self.description + " (quick variant)", self.imports)

    def check(self) -> None:
        """Resolve every job's spec (raises InvalidProblem on an unknown kind or bad field,
        or a submitted ``batch_size`` above the spec's ``max_batch_size``: no
        policy that runs the submitted batch could start the job)."""
        for job in self.jobs:
            try:
                spec = job.job_spec()
            except TypeError as exc:
                raise InvalidProblem(f"workload job {job.id!r}: bad spec field: {exc}") from exc
            if job.batch_size > spec.max_batch_size:
                raise InvalidProblem(f"workload job {job.id!r}: batch_size must be at most its max_batch_size "
                                     f"({spec.max_batch_size}), got {job.batch_size}")

    def to_json(self) -> dict:
        out = {"name": self.name, "description": self.description, "jobs": [j.to_json() for j in self.jobs]}
        if self.imports:  # absent when empty: the config.json of a run without imports is unchanged
            out["imports"] = list(self.imports)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Workload":
        if not isinstance(data, Mapping):
            raise InvalidProblem(f"a workload must be a JSON object, got {type(data).__name__}")
        if "jobs" not in data or not isinstance(data["jobs"], list):
            raise InvalidProblem("a workload needs a 'jobs' list")
        return cls(
            name=data.get("name", "workload"),
            jobs=tuple(WorkloadJob.from_json(j) for j in data["jobs"]),
            description=str(data.get("description", "")),
            imports=data.get("imports", ()),
        )
