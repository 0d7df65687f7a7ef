"""Backends of the scheduler loop: :mod:`~pollux_opt.backends.local` runs real
CPU jobs on this machine, :mod:`~pollux_opt.backends.sim` simulates a cluster.

The subpackages are not imported here, so that a real run does not load the
simulator and a simulation does not load the job runtime.
"""

__all__ = ["local", "sim"]
