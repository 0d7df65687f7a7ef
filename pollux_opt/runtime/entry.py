"""Where a job's spec comes from: a job kind registered by name, or a user's entry.

The registry holds the built-in jobs and any a user registers (:func:`register_job`,
``@training_job``, which declare the builder's module), e.g. for
``ElasticJob("digits-cnn", workdir)``; workers never consult it (a
:class:`JobSpec` names its builder and travels whole).

An *entry* is a function in a user's script or module, imported from a
directory the user points to: ``"path/to/script.py:function"`` (the script's
directory goes first on ``sys.path``, its module is the file's stem) or
``"package.module:function"`` (imported from the import directory).  The
function is either a builder of the builder protocol, ``build(ctx) ->
JobParts`` (one required parameter), or a user's own training loop,
``main()`` (no required parameter) that uses :mod:`pollux_opt.elastic`
(:func:`entry_protocol`).  Relative script paths are relative to the import
directory: a workload file's own directory, or ``--import DIR``.

Trust model: the one of :mod:`pollux_opt.runtime.spec`.
"""

from __future__ import annotations

import inspect
import keyword
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from solvers import InvalidProblem

from pollux_opt.runtime.builtin_jobs import BUILTIN_JOBS
from pollux_opt.runtime.spec import JobSpec, declare_builder_modules, import_from, refuse_stdlib, resolve_builder

__all__ = [
    "BUILDER", "ENTRY_REQUIRED_FIELDS", "LOOP", "entry_protocol", "entry_spec", "get_job", "job_names",
    "parse_entry", "register_job", "training_job",
]

#: The two protocols of an entry function.
BUILDER, LOOP = "builder", "loop"
#: Spec fields a workload job with an entry must give (its batch limits).
ENTRY_REQUIRED_FIELDS = ("init_batch_size", "max_batch_size")
#: Spec fields of which a workload job with an entry must give at least one (its completion).
_COMPLETION_FIELDS = ("epochs", "progress_target", "target")


def parse_entry(entry: Any, import_dir: str | Path, *, where: str = "entry") -> tuple[str, str, str]:
    """``(module, function, directory)`` of ``entry`` (see the module docstring).

    Raises:
        InvalidProblem: not of either shape, a missing script, or a standard-library module.
    """
    target, _, func = entry.rpartition(":") if isinstance(entry, str) else ("", "", "")
    if not target or not func.isidentifier():
        raise InvalidProblem(f"{where}: entry must be 'script.py:function' or 'package.module:function', got {entry!r}")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        path = (path if path.is_absolute() else Path(import_dir) / path).resolve()
        if not path.is_file():
            raise InvalidProblem(f"{where}: entry {entry!r}: script {str(path)!r} does not exist")
        module, directory = path.stem, str(path.parent)
    else:
        module, directory = target, str(Path(import_dir).expanduser().resolve())
    parts = module.split(".")
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise InvalidProblem(f"{where}: entry {entry!r}: {module!r} is not an importable module name")
    refuse_stdlib(f"entry {entry!r}", module, where)
    return module, func, directory


def entry_protocol(fn: Callable) -> str:
    """:data:`BUILDER` if ``fn`` has a required positional parameter (``build(ctx)``), else :data:`LOOP`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return BUILDER
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    return BUILDER if required else LOOP


def entry_spec(entry: str, import_dir: str | Path, *, name: str, fields: Mapping[str, Any], where: str):
    """The :class:`~pollux_opt.runtime.spec.JobSpec` of a workload job named by ``entry``.

    Imports the entry's module (declaring it, see the module docstring) and
    checks that the function exists and that ``fields`` give the batch limits
    and a completion criterion.

    Raises:
        InvalidProblem: a bad entry, a missing module, function or field, each with its own message.
    """
    module, func, directory = parse_entry(entry, import_dir, where=where)
    for taken in ("builder", "import_dir"):
        if taken in fields:
            raise InvalidProblem(f"{where}: spec field {taken!r} cannot be combined with an entry (the entry names it)")
    try:
        mod = import_from(module, directory)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0] and exc.name != module:
            raise InvalidProblem(f"{where}: entry {entry!r}: importing module {module!r} failed: {exc}") from None
        raise InvalidProblem(f"{where}: entry {entry!r}: module {module!r} not found in {directory!r}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while being imported
        raise InvalidProblem(f"{where}: entry {entry!r}: importing module {module!r} failed: "
                             f"{type(exc).__name__}: {exc}") from None
    if not callable(getattr(mod, func, None)):
        raise InvalidProblem(f"{where}: entry {entry!r}: module {module!r} has no function {func!r}")
    missing = [f for f in ENTRY_REQUIRED_FIELDS if f not in fields]
    if missing:
        raise InvalidProblem(f"{where}: a job with an entry needs spec field(s) {missing}")
    if not any(fields.get(f) is not None for f in _COMPLETION_FIELDS):
        raise InvalidProblem(f"{where}: a job with an entry needs one of the spec fields {list(_COMPLETION_FIELDS)}")
    declare_builder_modules([module])
    return JobSpec(name=name, builder=f"{module}:{func}", import_dir=directory, **fields)


_lock = threading.Lock()
#: Name -> spec.  A registry (like solvers.SOLVERS), not configuration; guarded by ``_lock``.
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
