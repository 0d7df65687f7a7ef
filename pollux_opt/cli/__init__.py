"""The ``pollux-opt`` command line."""

from pollux_opt.cli.main import main

__all__ = ["main"]
