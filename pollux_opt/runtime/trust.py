"""Which code a file may make the runtime import and call: the trust rules of builders and entries.

A builder (:mod:`pollux_opt.runtime.spec`) is code that the runtime imports
and calls, and so everything that names one is code too: a workload file (a
job's ``spec`` may set ``builder``, and its ``imports`` are imported when it
is read), a run directory's ``config.json`` (which holds the workload) and a
job's ``job.json`` (a resumed job runs the builder it names).  Run only workloads,
and resume only run and work directories, that you would run as a Python
script.  Within that, two rules keep a file from calling an arbitrary function:

* A builder in Python's standard library (a module whose top-level package is
  in ``sys.stdlib_module_names``: ``builtins``, ``os``, ``subprocess``, ...)
  is refused everywhere, in every process (:class:`~pollux_opt.runtime.spec.JobSpec`
  and :func:`~pollux_opt.runtime.spec.resolve_builder`), with
  :func:`stdlib_refusal`'s message.
* A builder named by a file (a workload job's ``spec``, a ``job.json``
  resumed with :meth:`ElasticJob.from_workdir
  <pollux_opt.runtime.job.ElasticJob.from_workdir>`) must be a function of
  the built-in jobs (:data:`BUILTIN_JOBS_MODULE`) or of a module this
  process's code declared: one that registered a job
  (:func:`~pollux_opt.runtime.registry.register_job`, ``@training_job``) or
  passed a builder function object to :class:`~pollux_opt.runtime.spec.JobSpec`, one a workload lists
  in ``imports``, or one passed to :func:`declare_builder_modules`
  (:func:`check_declared_builder`).

An entry (:mod:`pollux_opt.runtime.entry`) is held to the same rules: a
workload file that names one is code (the entry's module is imported when the
workload is read, and it is declared, so a resumed ``job.json`` may name it);
a module of Python's standard library is refused.  A user's module is
imported from the directory the user points to (:func:`import_from`).
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
from pathlib import Path
from typing import Any, Iterable

from solvers import InvalidProblem

__all__ = [
    "BUILTIN_JOBS_MODULE", "builder_module", "check_declared_builder", "declare_builder_modules",
    "declared_builder_modules", "import_from", "refuse_stdlib", "stdlib_refusal",
]

#: The module of the project's built-in jobs, whose builders any workload may name.
BUILTIN_JOBS_MODULE = "pollux_opt.runtime.builtin_jobs"
#: Serialises changes to ``sys.path`` and ``sys.modules`` by :func:`import_from`.
_import_lock = threading.Lock()


def builder_module(path: str) -> str:
    """The module part of a builder path ``"package.module:function"``."""
    return path.partition(":")[0]


def stdlib_refusal(what: str, module: str) -> str | None:
    """The message refusing ``what`` (``"builder 'os:system'"``) if ``module`` is in
    Python's standard library (its top-level package is in ``sys.stdlib_module_names``),
    else None."""
    top = module.split(".")[0]
    if top not in sys.stdlib_module_names:
        return None
    return (
        f"{what} is refused: module {top!r} is part of Python's standard library; a builder "
        "must be a function of the built-in jobs or of a module your code or workload declares"
    )


def refuse_stdlib(path: str) -> str:
    """``path`` (a builder path) unless its module is in the standard library (:func:`stdlib_refusal`).

    Raises:
        InvalidProblem: with :func:`stdlib_refusal`'s message.
    """
    message = stdlib_refusal(f"builder {path!r}", builder_module(path))
    if message is not None:
        raise InvalidProblem(message)
    return path


#: Modules whose builders a file may name (see the module docstring); guarded by ``_lock``.
_MODULES: set[str] = {BUILTIN_JOBS_MODULE}
_lock = threading.Lock()
#: A dotted module name, as a workload's ``imports`` lists them.
_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def declare_builder_modules(modules: Iterable[str], *, import_them: bool = False) -> None:
    """Let files name builders of ``modules`` (importing each first if ``import_them``).

    Raises:
        InvalidProblem: not a module name, a standard-library module, or (with
            ``import_them``) one that cannot be imported.
    """
    if isinstance(modules, str):
        raise InvalidProblem(f"imports must be a list of module names, got {modules!r}")
    for name in modules:
        if not isinstance(name, str) or not _MODULE_RE.fullmatch(name):
            raise InvalidProblem(f"imports entry must be a dotted module name, got {name!r}")
        message = stdlib_refusal(f"imports entry {name!r}", name)
        if message is not None:
            raise InvalidProblem(message)
        if import_them:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise InvalidProblem(f"imports entry {name!r} cannot be imported: {exc}") from None
        with _lock:
            _MODULES.add(name)


def declared_builder_modules() -> frozenset[str]:
    """The modules whose builders a file may name, now."""
    with _lock:
        return frozenset(_MODULES)


def check_declared_builder(path: Any, *, where: str) -> str:
    """``path`` if it is a builder of a declared module (see the module docstring).

    Args:
        path: the builder's import path ``"package.module:function"``.
        where: what named it, for the message (``"workload job 'a'"``, ``"job.json in '...'"``).

    Raises:
        InvalidProblem: a standard-library module, or one not declared.
    """
    module = builder_module(path) if isinstance(path, str) else None
    message = stdlib_refusal(f"builder {path!r}", module) if module is not None else None
    if message is not None:
        raise InvalidProblem(f"{where}: {message}")
    declared = declared_builder_modules()
    if module not in declared:
        raise InvalidProblem(
            f"{where}: builder {path!r} is not from a declared module; list its module in the workload's "
            f"'imports', or register the job from Python (declared: {sorted(declared)})"
        )
    return path


def _from_dir(module, directory: str) -> bool:
    origin = getattr(module, "__file__", None)
    return origin is not None and Path(origin).resolve().is_relative_to(directory)


def import_from(module: str, directory: str) -> Any:
    """Import ``module`` with ``directory`` first on ``sys.path``; a module of that
    name imported from elsewhere before (another job's ``train.py`` in a warm
    worker) is imported afresh."""
    with _import_lock:
        if directory not in sys.path:
            sys.path.insert(0, directory)
        top = module.split(".")[0]
        loaded = sys.modules.get(top)
        if loaded is not None and not _from_dir(loaded, directory):
            for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                del sys.modules[name]
        return importlib.import_module(module)
