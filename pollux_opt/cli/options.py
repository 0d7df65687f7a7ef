"""Arguments several commands share (``run``, ``demo`` and ``serve``)."""

from __future__ import annotations

import argparse

from solvers import InvalidProblem

__all__ = ["cluster_from_args"]


def cluster_from_args(args: argparse.Namespace):
    """The cluster ``--cluster`` describes (a :class:`~pollux_opt.model.cluster_types.ClusterTypes`,
    checked against this machine's CPUs) or ``--nodes`` / ``--cpus`` ask for (0 is
    an error, not "unset"); None if none of them."""
    from pollux_opt.backends.local import default_cluster

    if getattr(args, "cluster", None) is not None:
        from pollux_opt.backends.local.nodes import typed_cluster
        from pollux_opt.model.cluster_types import load_cluster_types

        if args.nodes is not None or args.cpus is not None:
            raise InvalidProblem("--cluster describes the nodes: give it without --nodes and --cpus")
        types = load_cluster_types(args.cluster)
        typed_cluster(types)  # more CPUs than this process may use is refused before anything runs
        return types
    if args.nodes is None and args.cpus is None:
        return None
    return default_cluster(1 if args.nodes is None else args.nodes, args.cpus)
