"""Optional dependencies (the package's extras), imported on first use.

torch (``jobs``), Ray (``ray``), JAX (``evo``) and matplotlib (``plots``) stay
out of the core install; code that needs one imports it inside a function
through :func:`require`, which raises :class:`MissingExtra` naming what to
install.  The command line turns that into one line and exit status 2.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtra", "require"]


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra to install."""


def require(module: str, message: str) -> ModuleType:
    """Import and return ``module``, or raise :class:`MissingExtra` with ``message``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(message) from exc
