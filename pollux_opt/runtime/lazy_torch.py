"""Lazy access to PyTorch, an optional extra (``pollux-opt[jobs]``): nothing in
``pollux_opt`` imports torch at module import time, so that ``import pollux_opt``
works without it; code that needs it calls :func:`require_torch` inside a function.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from pollux_opt.extras import MissingExtra, require

__all__ = ["TORCH_MISSING", "check_torch", "require_torch"]

#: Message of the ImportError raised when torch is needed but not installed.
TORCH_MISSING = (
    "pollux-opt's training-job runtime needs PyTorch (torch>=2.2,<2.14, the CPU build "
    "is enough); install the extra with: pip install 'pollux-opt[jobs]'"
)


def check_torch() -> None:
    """Raise :class:`~pollux_opt.extras.MissingExtra` unless torch can be imported;
    looks it up without importing it (a controller never pays torch's import time)."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a None entry in sys.modules blocks the import
        found = False
    if not found:
        raise MissingExtra(TORCH_MISSING)


def require_torch() -> ModuleType:
    """Import and return torch, or raise :class:`~pollux_opt.extras.MissingExtra` with :data:`TORCH_MISSING`."""
    return require("torch", TORCH_MISSING)
