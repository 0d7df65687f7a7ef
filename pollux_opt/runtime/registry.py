"""The registry of job kinds: the built-ins plus any a user registers, by name
(``ElasticJob("digits-cnn", workdir)``).  Workers never consult it: a
:class:`JobSpec` names its builder and travels whole.  Registering a job
declares its builder's module (the trust model of :mod:`pollux_opt.runtime.spec`).
"""

from __future__ import annotations

import threading
from typing import Callable

from solvers import InvalidProblem

from pollux_opt.runtime.spec import JobSpec, declare_builder_modules, resolve_builder
from pollux_opt.runtime.builtin_jobs import BUILTIN_JOBS

__all__ = ["get_job", "job_names", "register_job", "training_job"]

_lock = threading.Lock()
# Name -> spec.  A registry (like solvers.SOLVERS), not configuration.
_JOBS: dict[str, JobSpec] = {spec.name: spec for spec in BUILTIN_JOBS}


def register_job(spec: JobSpec, *, replace: bool = False) -> JobSpec:
    """Register ``spec`` under ``spec.name``; returns it.

    Raises:
        InvalidProblem: the name is taken (unless ``replace``), or the builder cannot be imported.
    """
    if not isinstance(spec, JobSpec):
        raise InvalidProblem(f"spec must be a JobSpec, got {spec!r}")
    try:
        resolve_builder(spec.builder)
    except (ImportError, AttributeError) as exc:
        raise InvalidProblem(f"builder {spec.builder!r} of job {spec.name!r} cannot be imported: {exc}") from None
    return _store(spec, replace)


def _store(spec: JobSpec, replace: bool) -> JobSpec:
    with _lock:
        if spec.name in _JOBS and not replace and _JOBS[spec.name] != spec:
            raise InvalidProblem(f"a job named {spec.name!r} is already registered; pass replace=True to replace it")
        _JOBS[spec.name] = spec
    declare_builder_modules([spec.builder.partition(":")[0]])  # the code that registered it declares its module
    return spec


def training_job(**fields) -> Callable:
    """Decorator registering a builder function as a job kind.

    Example::

        @training_job(name="my-mlp", init_batch_size=32, max_batch_size=1024, target=0.9)
        def build(ctx: BuildContext) -> JobParts:
            ...

    The function must be defined at module top level (workers import it by name).
    """

    def decorate(fn: Callable) -> Callable:
        # Not resolved (its module is still being imported); JobSpec checks that ``fn`` is top-level.
        _store(JobSpec(builder=fn, **fields), replace=True)
        return fn

    return decorate


def get_job(name: str) -> JobSpec:
    """The registered spec called ``name``; InvalidProblem listing the known names otherwise."""
    with _lock:
        try:
            return _JOBS[name]
        except KeyError:
            raise InvalidProblem(f"unknown job {name!r}; registered jobs: {sorted(_JOBS)}") from None


def job_names() -> tuple[str, ...]:
    """Names of all registered jobs, sorted."""
    with _lock:
        return tuple(sorted(_JOBS))
