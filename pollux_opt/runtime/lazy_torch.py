"""Lazy access to PyTorch: the runtime is an optional extra (``pollux-opt[jobs]``).

Nothing in ``pollux_opt`` imports torch at module import time; code that needs
it calls :func:`require_torch` (or :func:`check_torch`) inside a function, so
``import pollux_opt`` works on an install without the extra.
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
    """Raise ImportError with :data:`TORCH_MISSING` unless torch can be imported.

    Cheap: looks the module up without importing it (so a controller process
    that only starts workers never pays torch's import time).
    """
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a None entry in sys.modules blocks the import
        found = False
    if not found:
        raise MissingExtra(TORCH_MISSING)


def require_torch() -> ModuleType:
    """Import and return torch, or raise :class:`~pollux_opt.extras.MissingExtra` with :data:`TORCH_MISSING`."""
    return require("torch", TORCH_MISSING)
