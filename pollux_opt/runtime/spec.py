"""Job specifications: what a training job is, the protocol to define one, and
which code a file may make the runtime import and call.

A job is described by a frozen, JSON-serialisable :class:`JobSpec` (batch
limits, learning-rate rule, validation target) that names a *builder*: an
importable top-level function ``build(ctx: BuildContext) -> JobParts`` that
constructs the model, optimizer, data access, loss and validation metric inside
a worker process.  The runtime owns everything else: sampling, data-parallel
synchronisation, gradient statistics, learning-rate scaling, checkpoints.  The
builder is referenced by its import path (``"package.module:function"``)
because it runs in other processes (the workers, the fresh verification
process), and because a job must be resumable from its work directory alone.

Trust model.  A builder, or an entry (:mod:`pollux_opt.runtime.entry`), is
code, so every file that names one is code too: a workload file (a job's
``spec`` ``builder``, its ``entry``, its ``imports``, imported when it is
read), a run directory's ``config.json`` and a job's ``job.json``.  Run only
workloads, and resume only run and work directories, that you would run as a
Python script.  Within that, two rules keep a file from calling an arbitrary function:

* A module of Python's standard library (its top-level package is in
  ``sys.stdlib_module_names``: ``builtins``, ``os``, ``subprocess``, ...) is
  refused everywhere, in every process (:func:`refuse_stdlib`).
* A builder named by a file (a workload job's ``spec``, a resumed
  ``job.json``) must be of the built-in jobs (:data:`BUILTIN_JOBS_MODULE`) or
  of a module this process's code declared (:func:`check_declared_builder`):
  one that registered a job (:func:`~pollux_opt.runtime.entry.register_job`,
  ``@training_job``), passed a builder function object to :class:`JobSpec`, a
  workload lists in ``imports``, a workload's entry names, or one passed to
  :func:`declare_builder_modules`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from solvers import InvalidProblem

from pollux_opt.model.batch import DEFAULT_MAX_ACCUM_STEPS, BatchLimits
from pollux_opt.model.domains import (
    NAME,
    REQUIRED,
    Boolean,
    Choice,
    Integer,
    Real,
    Text,
    check_fields,
    domain_field,
)

__all__ = [
    "BUILTIN_JOBS_MODULE", "LR_SCALING_RULES", "BuildContext", "JobParts", "JobSpec", "check_declared_builder",
    "declare_builder_modules", "grad_scaler", "import_from", "refuse_stdlib", "resolve_builder",
]

#: Learning-rate scaling rules a job may declare, as functions of the batch
#: scale S = M / M0 and the AdaScale gain r (Johnson et al., "AdaScale SGD",
#: ICML 2020; Pollux, section 3.1):
#: ``adascale``: lr * r (for SGD); ``sqrt``: lr * sqrt(S) (for Adam-like
#: optimizers, Krizhevsky 2014 / Hoffer et al. 2017); ``linear``: lr * S
#: (Goyal et al. 2017); ``none``: lr unchanged.
LR_SCALING_RULES = ("adascale", "sqrt", "linear", "none")

#: The module of the project's built-in jobs, whose builders any workload may name.
BUILTIN_JOBS_MODULE = "pollux_opt.runtime.builtin_jobs"
#: Modules whose builders a file may name (see the module docstring); guarded by ``_lock``.
_MODULES: set[str] = {BUILTIN_JOBS_MODULE}
_lock = threading.Lock()
#: Serialises changes to ``sys.path`` and ``sys.modules`` by :func:`import_from`.
_import_lock = threading.Lock()
#: Top-level modules :func:`import_from` imported (jobs' code): the only ones it replaces; guarded by ``_import_lock``.
_job_modules: set[str] = set()
#: A dotted module name, as a workload's ``imports`` lists them.
_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def refuse_stdlib(what: str, module: str, where: str | None = None) -> None:
    """Raise InvalidProblem refusing ``what`` (``"builder 'os:system'"``, named by
    ``where``) if ``module``'s top-level package is in ``sys.stdlib_module_names``."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        raise InvalidProblem(
            ("" if where is None else f"{where}: ") + f"{what} is refused: module {top!r} is part of Python's "
            "standard library; a builder must be a function of the built-in jobs or of a module your code or "
            "workload declares"
        )


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


def check_declared_builder(path: Any, *, where: str) -> None:
    """Refuse ``path`` unless it is a builder of a declared module (see the module docstring).

    Args:
        path: the builder's import path ``"package.module:function"``.
        where: what named it, for the message (``"workload job 'a'"``, ``"job.json in '...'"``).

    Raises:
        InvalidProblem: a standard-library module, or one not declared.
    """
    module = path.partition(":")[0] if isinstance(path, str) else None
    if module is not None:
        refuse_stdlib(f"builder {path!r}", module, where)
    with _lock:
        declared = frozenset(_MODULES)
    if module not in declared:
        raise InvalidProblem(
            f"{where}: builder {path!r} is not from a declared module; list its module in the workload's "
            f"'imports', or register the job from Python (declared: {sorted(declared)})"
        )


def import_from(module: str, directory: str) -> Any:
    """Import ``module`` with ``directory`` first on ``sys.path``.  A module of
    that name a job imported from elsewhere before (another job's ``train.py``
    in a warm worker) is imported afresh; one the process loaded itself (a
    library, pollux-opt, a service's own code) is never replaced.

    Raises:
        InvalidProblem: ``module``'s top-level name is a module this process
            loaded from elsewhere, not for a job.
    """
    with _import_lock:
        top = module.split(".")[0]
        loaded = sys.modules.get(top)
        origin = getattr(loaded, "__file__", None)
        if loaded is not None and (origin is None or not Path(origin).resolve().is_relative_to(directory)):
            if top not in _job_modules:
                raise InvalidProblem(f"module {top!r} is loaded in this process from {origin or 'its built-ins'}: "
                                     f"importing the job's module from {directory} would replace it; rename the "
                                     f"job's module")
            for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                del sys.modules[name]
        if directory not in sys.path:
            sys.path.insert(0, directory)
        imported = importlib.import_module(module)
        _job_modules.add(top)
        return imported


_BUILDER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _builder_path(builder: str | Callable[..., Any]) -> str:
    if isinstance(builder, str):
        if not _BUILDER_RE.match(builder):
            raise InvalidProblem(
                f"builder must be an import path 'package.module:function', got {builder!r}"
            )
        refuse_stdlib(f"builder {builder!r}", builder.partition(":")[0])
        return builder
    if not callable(builder):
        raise InvalidProblem(f"builder must be a callable or an import path, got {builder!r}")
    module = getattr(builder, "__module__", None)
    qualname = getattr(builder, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise InvalidProblem(
            "builder must be a top-level function that worker processes can import by name, "
            f"got {builder!r} (qualname {qualname!r})"
        )
    path = f"{module}:{qualname}"
    refuse_stdlib(f"builder {path!r}", module)
    declare_builder_modules([module])  # a function object this process's code passes is its own code
    return path


def resolve_builder(path: str, import_dir: str | None = None) -> Callable[["BuildContext"], "JobParts"]:
    """Import the builder function named by ``"package.module:function"``
    (from ``import_dir`` first, if given: :func:`import_from`).

    Raises:
        InvalidProblem: a standard-library module (see the module docstring), or not a callable.
    """
    module_name, _, attr = path.partition(":")
    refuse_stdlib(f"builder {path!r}", module_name)
    if import_dir is not None:
        obj: Any = import_from(module_name, import_dir)
    else:
        obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise InvalidProblem(f"builder {path!r} does not name a callable, got {obj!r}")
    return obj


def _canonical_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise InvalidProblem(f"config must be a mapping of builder options, got {config!r}")
    try:
        text = json.dumps(dict(config), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidProblem(f"config must be JSON-serialisable, got {config!r} ({exc})") from None
    return json.loads(text)


@dataclass(frozen=True)
class JobSpec:
    """A training job: its builder, batch limits, learning-rate rule and target.

    Attributes:
        name: job kind, letters, digits, '.', '_' and '-' (e.g. ``"digits-cnn"``).
        builder: import path ``"package.module:function"`` of the builder (a
            top-level function may be given; it is stored as its path).
        init_batch_size: M0, the total batch (samples) the hyper-parameters were
            tuned for; progress is counted in M0-equivalent iterations.
        max_batch_size: largest total batch M (samples).
        target: validation-metric value the job must reach to be complete
            (None: no metric target).
        metric: name of the validation metric (for reports).
        higher_is_better: True if the job completes when metric >= target, False
            when metric <= target (a loss or an error).
        lr_scaling: one of :data:`LR_SCALING_RULES`.
        min_local_bsz: smallest micro-batch per replica (samples).
        max_local_bsz: largest micro-batch per replica (samples, memory bound);
            ``None`` means max_batch_size.
        max_accum_steps: most extra gradient-accumulation micro-batches.
        eval_every: validation period, in M0-equivalent iterations (progress).
        seed: seed of model initialisation and of data order.
        config: JSON-serialisable options passed to the builder.
        description: one line for humans.
        epochs: epochs the job must complete (a user's loop counts them, see
            :mod:`pollux_opt.elastic`; the builder protocol's sample stream
            counts ``samples / train_size``); None: no such criterion.
        progress_target: M0-equivalent iterations (progress) the job must
            complete; None: no such criterion.
        import_dir: absolute directory put first on ``sys.path`` before the
            builder is imported (a user's job outside any installed package;
            see :mod:`~pollux_opt.runtime.entry`); None: none.

    Completion: the job is complete when every criterion that is set holds
    (``target``, ``epochs``, ``progress_target``; at least one must be set),
    confirmed in a fresh process (:mod:`~pollux_opt.runtime.verify`).
    """

    name: str = domain_field(REQUIRED, NAME)
    builder: str
    init_batch_size: int
    max_batch_size: int
    target: float | None = domain_field(None, Real(none=True))
    metric: str = domain_field("accuracy", Text())
    higher_is_better: bool = domain_field(True, Boolean())
    lr_scaling: str = domain_field("adascale", Choice(LR_SCALING_RULES))
    min_local_bsz: int = 1
    max_local_bsz: int | None = None
    max_accum_steps: int = DEFAULT_MAX_ACCUM_STEPS
    eval_every: float = domain_field(50.0, Real(gt=0))
    seed: int = domain_field(0, Integer(ge=0))
    config: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    epochs: int | None = domain_field(None, Integer(ge=1, none=True))
    progress_target: float | None = domain_field(None, Real(gt=0, none=True))
    import_dir: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.target is None and self.epochs is None and self.progress_target is None:
            raise InvalidProblem(
                f"job {self.name!r} needs a completion criterion: set target, epochs or progress_target"
            )
        absolute = isinstance(self.import_dir, str) and Path(self.import_dir).is_absolute()
        if self.import_dir is not None and not absolute:
            raise InvalidProblem(f"import_dir must be an absolute directory path, got {self.import_dir!r}")
        object.__setattr__(self, "builder", _builder_path(self.builder))
        limits = self.limits()  # validates the batch fields, naming the bad one
        object.__setattr__(self, "max_local_bsz", limits.max_local_bsz)
        if self.target is not None:
            object.__setattr__(self, "target", float(self.target))
        object.__setattr__(self, "eval_every", float(self.eval_every))
        object.__setattr__(self, "config", _canonical_config(self.config))

    def __hash__(self) -> int:
        return hash(self.to_json())

    def limits(self) -> BatchLimits:
        """The :class:`~pollux_opt.model.batch.BatchLimits` of this job."""
        return BatchLimits(
            init_batch_size=self.init_batch_size,
            max_batch_size=self.max_batch_size,
            min_local_bsz=self.min_local_bsz,
            max_local_bsz=self.max_local_bsz,
            max_accum_steps=self.max_accum_steps,
        )

    def reached(self, metric: float | None) -> bool:
        """True if ``metric`` meets the target (NaN and None never do, nor any without a target)."""
        if metric is None or self.target is None or not math.isfinite(metric):
            return False
        return metric >= self.target if self.higher_is_better else metric <= self.target

    def counts_reached(self, progress: float, epochs: float) -> bool:
        """True if the ``epochs`` and ``progress_target`` criteria (those set) hold."""
        if self.epochs is not None and epochs < self.epochs:
            return False
        return self.progress_target is None or progress >= self.progress_target

    def replace(self, **changes: Any) -> "JobSpec":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        """Canonical JSON text (sorted keys) from which :meth:`from_json` rebuilds the spec."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        """Rebuild a spec from :meth:`to_json` output."""
        data = json.loads(text)
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise InvalidProblem(f"unknown JobSpec fields {unknown} in JSON")
        return cls(**data)


@dataclass(frozen=True)
class BuildContext:
    """What a builder receives.

    Attributes:
        seed: the job's seed; the runtime has already called
            ``torch.manual_seed(seed)``, so parameter initialisation is identical
            in every worker.
        config: the spec's ``config`` (builder options).
        workdir: the job's work directory (a builder may cache derived data there).
    """

    seed: int
    config: Mapping[str, Any]
    workdir: Path


@dataclass
class JobParts:
    """What a builder returns (the job protocol).

    The runtime draws sample indices itself (a seeded permutation per epoch,
    resumable at any sample), so data access is a pure function of indices.

    Attributes:
        model: a ``torch.nn.Module``; its parameters are averaged by all-reduce.
        optimizer: a ``torch.optim.Optimizer`` over the model's parameters, built
            with the learning rate tuned for ``init_batch_size`` (the runtime
            rescales ``lr`` of every param group before each step).
        train_size: number of training samples (indices ``0 .. train_size - 1``).
        get_batch: ``indices (int64 tensor) -> batch``, the samples at those indices.
        loss: ``(model, batch) -> scalar tensor``, the *mean* loss over the batch.
        evaluate: ``model -> float``, the validation metric (called under
            ``torch.no_grad()`` with ``model.eval()``); must be deterministic.
        scaler: optional object with ``state_dict()`` / ``load_state_dict()``,
            checkpointed with the job; a gradient scaler of mixed precision
            (:func:`grad_scaler`) also scales the loss, and the runtime
            unscales each step's reduced gradient and skips an overflowed step.
        max_grad_norm: optional clip of the averaged gradient's norm.
    """

    model: Any
    optimizer: Any
    train_size: int = domain_field(REQUIRED, Integer(ge=1))
    get_batch: Callable[[Any], Any]
    loss: Callable[[Any, Any], Any]
    evaluate: Callable[[Any], float]
    scaler: Any = None
    max_grad_norm: float | None = domain_field(None, Real(gt=0, finite=False, none=True))

    def check(self, builder: str) -> None:
        """Raise InvalidProblem naming the builder and field if a part is malformed."""
        torch = importlib.import_module("torch")
        if not isinstance(self.model, torch.nn.Module):
            raise InvalidProblem(f"builder {builder!r}: model must be a torch.nn.Module, got {self.model!r}")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise InvalidProblem(
                f"builder {builder!r}: optimizer must be a torch.optim.Optimizer, got {self.optimizer!r}"
            )
        check_fields(self, prefix=f"builder {builder!r}: ")
        for name in ("get_batch", "loss", "evaluate"):
            if not callable(getattr(self, name)):
                raise InvalidProblem(f"builder {builder!r}: {name} must be callable, got {getattr(self, name)!r}")


def grad_scaler(scaler: Any) -> Any:
    """``scaler`` where it is a gradient scaler of mixed precision (it unscales
    gradients, as ``torch.amp.GradScaler`` does), else None."""
    return scaler if callable(getattr(scaler, "unscale_", None)) else None


def workdir_path(workdir: str | Path) -> Path:
    """Absolute path of a work directory (not created)."""
    return Path(workdir).expanduser().resolve()
