"""Field domains, declared once per field and checked by one function.

Configuration dataclasses (:class:`~pollux_opt.model.options.Options`, the
simulator's and the runtime's options, workload jobs) declare each numeric or
boolean field's domain next to the field::

    @dataclass(frozen=True)
    class Options:
        p: float = domain_field(-1.0, Real(finite=True))
        time_limit: float | None = domain_field(None, Real(gt=0, none=True))

        def __post_init__(self):
            check_fields(self, prefix="options.")

A bad value raises :class:`solvers.InvalidProblem` (a ``ValueError``) naming
the field and the value, in the one phrasing every error of the project uses:
``options.p must be a finite number, got nan``.  ``bool`` is never accepted as
a number (``True`` is an ``int`` to Python, never a replica count to a user).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from solvers import InvalidProblem

__all__ = ["Boolean", "Domain", "Integer", "Real", "check", "check_fields", "domain_field"]

#: Metadata key under which :func:`domain_field` stores a field's domain.
DOMAIN_KEY = "domain"


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


@dataclass(frozen=True)
class Domain:
    """Base: which values a field takes; ``none`` admits ``None``."""

    none: bool = False

    def text(self) -> str:  # pragma: no cover - every domain overrides it
        raise NotImplementedError

    def accepts(self, value: Any) -> bool:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.text()} or None" if self.none else self.text()


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
        return (
            isinstance(value, numbers.Integral) and not isinstance(value, bool) and self._in_bounds(int(value))
        )


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
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
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


def check(name: str, value: Any, domain: Domain, *, prefix: str = "") -> Any:
    """``value`` itself if the domain admits it, else :class:`InvalidProblem`.

    Raises:
        InvalidProblem: ``"{prefix}{name} must be {domain}, got {value!r}"``.
    """
    if value is None and domain.none:
        return None
    if value is None or not domain.accepts(value):
        raise InvalidProblem(f"{prefix}{name} must be {domain.describe()}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """``repr`` of ``value``, shortened: a 5000-digit integer is not an error message."""
    if isinstance(value, int) and value.bit_length() > 100:  # repr() of 10**5000 raises
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def domain_field(default: Any, domain: Domain, **kwargs: Any) -> Any:
    """A dataclass field with ``default`` and its ``domain`` in the metadata."""
    return dataclasses.field(default=default, metadata={DOMAIN_KEY: domain}, **kwargs)


def check_fields(obj: Any, *, prefix: str = "") -> None:
    """Check every field of the dataclass ``obj`` that declares a domain, in
    declaration order."""
    for f in dataclasses.fields(obj):
        domain = f.metadata.get(DOMAIN_KEY)
        if domain is not None:
            check(f.name, getattr(obj, f.name), domain, prefix=prefix)
