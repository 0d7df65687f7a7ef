"""Arguments several commands share (``run``, ``demo`` and ``serve``)."""

from __future__ import annotations

import argparse

from solvers import InvalidProblem

__all__ = ["add_backend_args", "add_cluster_args", "cluster_from_args"]


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """``--nodes``, ``--cpus`` and ``--cluster``: this machine's CPUs as nodes (read by :func:`cluster_from_args`)."""
    p.add_argument("--nodes", type=int, help="split this machine's CPUs into this many nodes (default 1)")
    p.add_argument("--cpus", type=int, help="CPUs to use (default: all this process may use)")
    p.add_argument("--cluster", metavar="FILE|PRESET",
                   help="node types instead of --nodes/--cpus: a JSON description (as for simulate) or a "
                        "preset, e.g. local-hetero (one fast and one slow node of one CPU each; a type's "
                        "cpu_quota < 1 throttles its nodes with cgroup CPU quotas, which need root)")


def add_backend_args(p: argparse.ArgumentParser, run_dir_flag: str) -> None:
    """``--backend``, ``--ray-address`` and ``--checkpoint-dir`` (whose default is ``run_dir_flag``'s directory)."""
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="where the jobs run: this machine (default) or the nodes of a Ray cluster")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to use with --backend ray, e.g. HOST:6379 (default: start a local Ray instance)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="with --backend ray: a directory every node sees at the same path (shared file system) "
                        f"for the jobs' checkpoints and logs (default: {run_dir_flag})")


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
