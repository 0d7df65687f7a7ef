"""The Ray backend: a workload's real jobs on the nodes of a Ray cluster.

:mod:`~pollux_opt.backends.ray.backend` (:func:`run_ray_workload` and
:class:`RayBackend`, the real backend over Ray's nodes),
:mod:`~pollux_opt.backends.ray.pool` (replica actors as the runtime's workers)
and :mod:`~pollux_opt.backends.ray.actors` (the actors, called by method).
Ray is the ``ray`` extra, imported when a run starts (see docs/ray.md).
"""

from pollux_opt.backends.ray.backend import run_ray_workload

__all__ = ["run_ray_workload"]
