"""Which code a file may make the runtime import and call: the trust rules of builders and entries.

A builder (:mod:`pollux_opt.runtime.spec`) or an entry
(:mod:`pollux_opt.runtime.entry`) is code that the runtime imports and calls,
so every file that names one is code too: a workload file (a job's ``spec``
``builder``, its ``entry``, its ``imports``, imported when it is read), a run
directory's ``config.json`` (which holds the workload) and a job's
``job.json`` (a resumed job runs the builder it names).  Run only workloads,
and resume only run and work directories, that you would run as a Python
script.  Within that, two rules keep a file from calling an arbitrary function:

* A module of Python's standard library (its top-level package is in
  ``sys.stdlib_module_names``: ``builtins``, ``os``, ``subprocess``, ...) is
  refused everywhere, in every process, with :func:`refuse_stdlib`'s message.
* A builder named by a file (a workload job's ``spec``, a resumed
  ``job.json``) must be a function of the built-in jobs
  (:data:`BUILTIN_JOBS_MODULE`) or of a module this process's code declared
  (:func:`check_declared_builder`): one that registered a job
  (:func:`~pollux_opt.runtime.registry.register_job`, ``@training_job``),
  passed a builder function object to :class:`~pollux_opt.runtime.spec.JobSpec`,
  a workload lists in ``imports``, a workload's entry names, or one passed to
  :func:`declare_builder_modules`.

A user's module is imported from the directory the user points to (:func:`import_from`).
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
    "declared_builder_modules", "import_from", "refuse_stdlib",
]

#: The module of the project's built-in jobs, whose builders any workload may name.
BUILTIN_JOBS_MODULE = "pollux_opt.runtime.builtin_jobs"
#: Serialises changes to ``sys.path`` and ``sys.modules`` by :func:`import_from`.
_import_lock = threading.Lock()


def builder_module(path: str) -> str:
    """The module part of a builder path ``"package.module:function"``."""
    return path.partition(":")[0]


def refuse_stdlib(what: str, module: str, where: str | None = None) -> None:
    """Refuse ``what`` (``"builder 'os:system'"``), named by ``where`` (for the
    message), if ``module`` is in Python's standard library.

    Raises:
        InvalidProblem: ``module``'s top-level package is in ``sys.stdlib_module_names``.
    """
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        raise InvalidProblem(
            ("" if where is None else f"{where}: ") + f"{what} is refused: module {top!r} is part of Python's "
            "standard library; a builder must be a function of the built-in jobs or of a module your code or "
            "workload declares"
        )


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
        refuse_stdlib(f"imports entry {name!r}", name)
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
    if module is not None:
        refuse_stdlib(f"builder {path!r}", module, where)
    declared = declared_builder_modules()
    if module not in declared:
        raise InvalidProblem(
            f"{where}: builder {path!r} is not from a declared module; list its module in the workload's "
            f"'imports', or register the job from Python (declared: {sorted(declared)})"
        )
    return path


def import_from(module: str, directory: str) -> Any:
    """Import ``module`` with ``directory`` first on ``sys.path``; a module of that
    name imported from elsewhere before (another job's ``train.py`` in a warm
    worker) is imported afresh."""
    with _import_lock:
        if directory not in sys.path:
            sys.path.insert(0, directory)
        top = module.split(".")[0]
        loaded = sys.modules.get(top)
        origin = getattr(loaded, "__file__", None)
        if loaded is not None and (origin is None or not Path(origin).resolve().is_relative_to(directory)):
            for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                del sys.modules[name]
        return importlib.import_module(module)
