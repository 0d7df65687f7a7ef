"""The Ray backend: a workload's real jobs on the nodes of a Ray cluster.

:mod:`~pollux_opt.backends.ray.backend` (:class:`RayBackend`, the real backend
over Ray's nodes), :mod:`~pollux_opt.backends.ray.pool` (replica actors as the
runtime's workers), :mod:`~pollux_opt.backends.ray.actors` (the actors, called by method),
:mod:`~pollux_opt.backends.ray.nodes` (Ray's nodes as the scheduler's cluster)
and :mod:`~pollux_opt.backends.ray.run` (:func:`run_ray_workload`).  Ray is the
``ray`` extra, imported when a run starts (see docs/ray.md).
"""

from pollux_opt.backends.ray.run import run_ray_workload

__all__ = ["run_ray_workload"]
