"""Field domains, declared once per field and checked by one function.

Configuration dataclasses (:class:`~pollux_opt.model.options.Options`, the
cluster's nodes and the jobs, the simulator's and the runtime's options, job
specs, workload jobs) declare each field's domain next to the field::

    @dataclass(frozen=True)
    class Options:
        p: float = domain_field(-1.0, Real(finite=True))
        time_limit: float | None = domain_field(None, Real(gt=0, none=True))

        def __post_init__(self):
            check_fields(self, prefix="options.")

A bad value raises :class:`solvers.InvalidProblem` (a ``ValueError``) naming
the field and the value, in the one phrasing every error of the project uses:
``options.p must be a finite number, got nan``.  ``bool`` is never accepted as
a number (``True`` is an ``int`` to Python, never a replica count to a user);
an admitted integer comes back (and is stored) as a Python ``int``.

Domains: :class:`Integer`, :class:`Real` (bounds, unit), :class:`Boolean`,
:class:`Text` (a non-empty string, optionally matching a pattern; :data:`NAME`),
:class:`Choice` (one of listed values) and :class:`Keyed` (a value, or a
``{name: value}`` mapping of values, checked entry by entry).  A field without
a default declares ``domain_field(REQUIRED, domain)``.  Function arguments are
checked with :func:`check` against a module-level domain constant.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Mapping

from solvers import InvalidProblem

__all__ = [
    "NAME",
    "REQUIRED",
    "Boolean",
    "Choice",
    "Domain",
    "Integer",
    "Keyed",
    "Real",
    "Text",
    "check",
    "check_fields",
    "domain_field",
    "shown",
]

#: Metadata key under which :func:`domain_field` stores a field's domain.
DOMAIN_KEY = "domain"
#: The ``default`` of :func:`domain_field` for a field that has none.
REQUIRED = dataclasses.MISSING


def _bound_text(ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    """``">= 0"``, ``"< 1"``, or an interval ``"in [0, 1)"`` when bounded on both sides."""
    lo = (ge, "[", ">=") if ge is not None else (gt, "(", ">") if gt is not None else None
    hi = (le, "]", "<=") if le is not None else (lt, ")", "<") if lt is not None else None
    if lo and hi:
        return f"in {lo[1]}{_num(lo[0])}, {_num(hi[0])}{hi[1]}"
    bound = lo or hi
    return f"{bound[2]} {_num(bound[0])}" if bound else ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


@dataclass(frozen=True, kw_only=True)
class Domain:
    """Base: which values a field takes; ``none`` (keyword-only) admits ``None``."""

    none: bool = False

    def text(self) -> str:  # pragma: no cover - every domain overrides it
        raise NotImplementedError

    def accepts(self, value: Any) -> bool:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.text()} or None" if self.none else self.text()

    def normal(self, value: Any) -> Any:
        """The admitted ``value`` in its canonical type (itself unless overridden)."""
        return value

    def checked(self, name: str, value: Any, prefix: str) -> Any:
        """:func:`check`'s work: ``value`` (normalised) or :class:`InvalidProblem`."""
        if value is None and self.none:
            return None
        if value is None or not self.accepts(value):
            raise InvalidProblem(f"{prefix}{name} must be {self.describe()}, got {shown(value)}")
        return self.normal(value)


@dataclass(frozen=True)
class _Bounded(Domain):
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def _in_bounds(self, x: float) -> bool:
        return not (
            (self.ge is not None and not x >= self.ge)
            or (self.gt is not None and not x > self.gt)
            or (self.le is not None and not x <= self.le)
            or (self.lt is not None and not x < self.lt)
        )

    def _bounds(self) -> str:
        return _bound_text(self.ge, self.gt, self.le, self.lt)


@dataclass(frozen=True)
class Integer(_Bounded):
    """An ``int`` (numpy integers included, ``bool`` excluded) within the bounds."""

    def text(self) -> str:
        b = self._bounds()
        return f"an integer {b}" if b else "an integer"

    def accepts(self, value: Any) -> bool:
        if type(value) is int:  # the common case, without the slow abstract-class check
            return self._in_bounds(value)
        return (
            isinstance(value, numbers.Integral) and not isinstance(value, bool) and self._in_bounds(int(value))
        )

    def normal(self, value: Any) -> int:
        """A Python ``int`` (a numpy integer is not JSON-serialisable)."""
        return int(value)


@dataclass(frozen=True)
class Real(_Bounded):
    """A real number (``int`` or ``float``, ``bool`` excluded) within the bounds;
    ``finite`` rules out nan and +-inf (nan never passes a bound either);
    ``unit`` names the unit in messages ("a finite number of seconds >= 0")."""

    finite: bool = True
    unit: str = ""

    def text(self) -> str:
        b = self._bounds()
        word = "a finite number" if self.finite else "a number"
        word = f"{word} of {self.unit}" if self.unit else word
        return f"{word} {b}" if b else word

    def accepts(self, value: Any) -> bool:
        if type(value) is float:  # the common case, without the slow abstract-class check
            x = value
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        else:
            try:
                x = float(value)
            except OverflowError:  # an int too large for a float
                return False
        if math.isnan(x) or (self.finite and math.isinf(x)):
            return False
        return self._in_bounds(x)


@dataclass(frozen=True)
class Boolean(Domain):
    """``True`` or ``False`` (not 0 / 1)."""

    def text(self) -> str:
        return "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Text(Domain):
    """A non-empty ``str``; with ``pattern``, one that the regular expression
    matches in full.  ``what`` describes the admitted strings in messages."""

    pattern: str | None = None
    what: str = "a non-empty string"

    def text(self) -> str:
        return self.what

    def accepts(self, value: Any) -> bool:
        return (
            isinstance(value, str)
            and value != ""
            and (self.pattern is None or re.fullmatch(self.pattern, value) is not None)
        )


#: Names of jobs and job kinds: safe as file names and in CSV and JSON.
NAME = Text(
    pattern=r"[A-Za-z0-9][A-Za-z0-9._-]*", what="letters, digits, '.', '_' or '-' (not starting with a symbol)"
)


@dataclass(frozen=True)
class Choice(Domain):
    """One of ``values``, of the same type as the value it equals (so ``True`` is
    not the choice ``1``, nor ``2.0`` the choice ``2``)."""

    values: tuple

    def text(self) -> str:
        return f"one of {list(self.values)}"

    def accepts(self, value: Any) -> bool:
        return any(type(value) is type(v) and value == v for v in self.values)


@dataclass(frozen=True)
class Keyed(Domain):
    """A value of ``item``, or a mapping of names to values of ``item``.  A
    mapping is checked entry by entry, naming the entry (``delay['ncf']``);
    any other value as an ``item``, in the item's words."""

    item: Domain

    def text(self) -> str:
        return f"{self.item.text()} or a mapping of names to such values"

    def accepts(self, value: Any) -> bool:
        if isinstance(value, Mapping):
            return all(self.item.accepts(v) or (v is None and self.item.none) for v in value.values())
        return self.item.accepts(value)

    def checked(self, name: str, value: Any, prefix: str) -> Any:
        if value is None and self.none:
            return None
        if isinstance(value, Mapping):
            for key, entry in value.items():
                self.item.checked(f"{name}[{key!r}]", entry, prefix)
            return value
        return self.item.checked(name, value, prefix)


def check(name: str, value: Any, domain: Domain, *, prefix: str = "") -> Any:
    """``value`` if the domain admits it (an integer as a Python ``int``), else
    :class:`InvalidProblem`.

    Raises:
        InvalidProblem: ``"{prefix}{name} must be {domain}, got {value!r}"``.
    """
    return domain.checked(name, value, prefix)


def shown(value: Any) -> str:
    """``repr`` of ``value`` for an error message, shortened: a 5000-digit integer is not an error message."""
    if isinstance(value, int) and value.bit_length() > 100:  # repr() of 10**5000 raises
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def domain_field(default: Any, domain: Domain, **kwargs: Any) -> Any:
    """A dataclass field with ``default`` (:data:`REQUIRED`: none) and its
    ``domain`` in the metadata."""
    return dataclasses.field(default=default, metadata={DOMAIN_KEY: domain}, **kwargs)


def check_fields(obj: Any, *, prefix: str = "", names: tuple[str, ...] | None = None) -> None:
    """Check every field of the dataclass ``obj`` that declares a domain (only
    those in ``names`` if given), in declaration order; an integer field holding
    a numpy integer is set to the equal ``int`` (frozen dataclasses included)."""
    for f in dataclasses.fields(obj):
        domain = f.metadata.get(DOMAIN_KEY)
        if domain is None or (names is not None and f.name not in names):
            continue
        value = getattr(obj, f.name)
        normal = check(f.name, value, domain, prefix=prefix)
        if type(normal) is not type(value):
            object.__setattr__(obj, f.name, normal)
