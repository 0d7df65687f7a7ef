"""Ray, imported lazily with a clear message where it is missing (the ``ray`` extra)."""

from __future__ import annotations

from pollux_opt.extras import require

__all__ = ["RAY_MISSING", "require_ray"]

#: What to do where Ray is not installed.
RAY_MISSING = "the Ray backend needs Ray: pip install 'pollux-opt[ray]'"


def require_ray():
    """The ``ray`` module (:class:`~pollux_opt.extras.MissingExtra` with :data:`RAY_MISSING` where it is not installed)."""
    return require("ray", RAY_MISSING)
