"""Ray, imported lazily with a clear message where it is missing (the ``ray`` extra)."""

from __future__ import annotations

__all__ = ["RAY_MISSING", "require_ray"]

#: What to do where Ray is not installed.
RAY_MISSING = "the Ray backend needs Ray: pip install 'pollux-opt[ray]'"


def require_ray():
    """The ``ray`` module (ImportError with :data:`RAY_MISSING` where it is not installed)."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(RAY_MISSING) from exc
    return ray
