"""Optional dependencies (the package's extras), imported on first use.

torch (``jobs``), Ray (``ray``), JAX (``evo``), matplotlib (``plots``) and the
service's web stack (``service``: FastAPI, uvicorn, httpx, prometheus_client) stay
out of the core install; code that needs one imports it inside a function
through :func:`require`, which raises :class:`MissingExtra` naming what to
install.  The command line turns that into one line and exit status 2.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["PLOTS_MISSING", "RAY_MISSING", "SERVICE_MISSING", "TORCH_MISSING", "MissingExtra", "check_installed", "require"]

#: The message of each missing extra: what needs it and how to install it.
TORCH_MISSING = (
    "pollux-opt's training-job runtime needs PyTorch (torch>=2.2,<2.14, the CPU build "
    "is enough); install the extra with: pip install 'pollux-opt[jobs]'"
)
RAY_MISSING = "the Ray backend needs Ray: pip install 'pollux-opt[ray]'"
PLOTS_MISSING = "plots need matplotlib: pip install 'pollux-opt[plots]'"
SERVICE_MISSING = "the service and its client need their extra: pip install 'pollux-opt[service]'"


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra to install."""


def require(module: str, message: str) -> ModuleType:
    """Import and return ``module``, or raise :class:`MissingExtra` with ``message``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(message) from exc


def check_installed(module: str, message: str) -> None:
    """Raise :class:`MissingExtra` with ``message`` unless ``module`` can be imported;
    looks it up without importing it (a controller never pays torch's import time)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a None entry in sys.modules blocks the import
        found = False
    if not found:
        raise MissingExtra(message)
