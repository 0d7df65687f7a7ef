"""Arguments several commands share (``run``, ``demo``, ``serve`` and ``simulate``)."""

from __future__ import annotations

import argparse
import logging

from solvers import InvalidProblem

__all__ = ["add_autoscale_args", "add_backend_args", "add_cluster_args", "autoscale_from_args", "cluster_from_args"]

log = logging.getLogger(__name__)


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """``--nodes``, ``--cpus``, ``--gpus`` and ``--cluster``: this machine's CPUs and GPUs as nodes
    (read by :func:`cluster_from_args`)."""
    p.add_argument("--nodes", type=int, help="split this machine's CPUs into this many nodes (default 1)")
    p.add_argument("--cpus", type=int, help="CPUs to use (default: all this process may use)")
    p.add_argument("--cluster", metavar="FILE|PRESET",
                   help="node types instead of --nodes/--cpus: a JSON description (as for simulate) or a "
                        "preset, e.g. local-hetero (one fast and one slow node of one CPU each; a type's "
                        "cpu_quota < 1 throttles its nodes with cgroup CPU quotas, which need root; a type's "
                        "slot \"gpu\" puts one replica on each of its GPUs)")
    p.add_argument("--gpus", metavar="N|all", default=None,
                   help="offer N of this machine's GPUs (all: every one torch sees) as node type 'gpu', one "
                        "replica per GPU, beside the remaining CPU cores as node type 'cpu' (default: CPU cores only)")


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

        if args.nodes is not None or args.cpus is not None or getattr(args, "gpus", None) is not None:
            raise InvalidProblem("--cluster describes the nodes: give it without --nodes, --cpus and --gpus")
        types = load_cluster_types(args.cluster)
        typed_cluster(types)  # more CPUs or GPUs than there are is refused before anything runs
        return types
    if getattr(args, "gpus", None) is not None:
        from pollux_opt.backends.local.nodes import gpu_cluster
        from pollux_opt.runtime.device import machine_gpus

        if args.nodes is not None:
            raise InvalidProblem("--gpus gives one node of GPUs and one of CPU cores: describe other nodes "
                                 "with --cluster, not --nodes")
        gpus = machine_gpus() if args.gpus == "all" else _count("--gpus", args.gpus)
        if args.gpus == "all" and not gpus:
            log.warning("--gpus all: torch sees no GPU here; the jobs run on CPU cores only")
        return gpu_cluster(gpus, args.cpus) if gpus else default_cluster(1, args.cpus)
    if args.nodes is None and args.cpus is None:
        return None
    return default_cluster(1 if args.nodes is None else args.nodes, args.cpus)


def _count(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidProblem(f"{flag} must be a number of GPUs or 'all', got {text!r}") from None


def add_autoscale_args(p: argparse.ArgumentParser, *, ray: bool) -> None:
    """``--autoscale MIN:MAX`` and the rule's settings (read by :func:`autoscale_from_args`);
    with ``ray``, also ``--node-cpus``."""
    from pollux_opt.scheduling.autoscale import DEFAULT_NODE_STARTUP_S, DEFAULT_TIME_VALUE, THRESHOLD_GROW

    where = ("with --backend ray: ask Ray's autoscaler for between MIN and MAX nodes each round"
             if ray else "size the cluster each round between MIN and MAX nodes (of the cluster that "
                         "--nodes/--cpus-per-node or --cluster give, the largest one)")
    p.add_argument("--autoscale", default=None, metavar="MIN:MAX", help=f"{where}; default: a fixed cluster")
    p.add_argument("--autoscale-rule", default="goodput", choices=("goodput", "throughput"),
                   help="what a node is worth: the jobs' goodput (default) or their throughput (the baseline)")
    p.add_argument("--time-value", type=_time_value, default=None, metavar="LAMBDA|none",
                   help="the cost rule: add a node while it lowers node cost plus LAMBDA slot-seconds per second "
                        f"of each active job, per unit of progress (default {DEFAULT_TIME_VALUE:g}); 'none': the "
                        "threshold rule (--grow-above/--shrink-below)")
    p.add_argument("--grow-above", type=float, default=None,
                   help="the threshold rule: add a node while each of its slots adds at least this (a slot of a "
                        f"job that has none: 1; default {THRESHOLD_GROW:g}; implies --time-value none)")
    p.add_argument("--shrink-below", type=float, default=None,
                   help="the threshold rule: release a node once its slots add less than this (default: half "
                        "of --grow-above)")
    p.add_argument("--node-startup", type=float, default=DEFAULT_NODE_STARTUP_S,
                   help=f"seconds from a node's request to its first replica (default {DEFAULT_NODE_STARTUP_S:g})")
    p.add_argument("--release-after", type=float, default=None, metavar="S",
                   help="seconds a smaller size must be wanted before nodes go (default: --node-startup)")
    if ray:
        p.add_argument("--node-cpus", type=int, default=None,
                       help="CPUs of a node Ray's autoscaler adds (default: the largest node at the start)")


def _time_value(text: str) -> float | str:
    """``--time-value``: a number, or ``none`` (the threshold rule)."""
    if text.strip().lower() == "none":
        return "none"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'none', got {text!r}") from None


def autoscale_from_args(args: argparse.Namespace):
    """``--autoscale MIN:MAX`` and its settings as :class:`~pollux_opt.scheduling.autoscale.ScaleOptions`
    (None without ``--autoscale``)."""
    from pollux_opt.scheduling.autoscale import DEFAULT_TIME_VALUE, ScaleOptions

    value = getattr(args, "autoscale", None)
    if value is None:
        return None
    lo, sep, hi = str(value).partition(":")
    try:
        bounds = int(lo), int(hi)
    except ValueError:
        bounds = None
    if not sep or bounds is None:
        raise InvalidProblem(f"--autoscale must be MIN:MAX, two node counts, got {value!r}")
    threshold = args.grow_above is not None or args.shrink_below is not None
    if args.time_value is None:  # not given: the threshold rule where its bars are, else the default
        time_value = None if threshold else DEFAULT_TIME_VALUE
    elif threshold and args.time_value != "none":
        raise InvalidProblem(f"--grow-above and --shrink-below are the threshold rule's; they do not go with "
                             f"--time-value {args.time_value:g}")
    else:
        time_value = None if args.time_value == "none" else args.time_value
    return ScaleOptions(min_nodes=bounds[0], max_nodes=bounds[1], rule=args.autoscale_rule, time_value=time_value,
                        grow_above=args.grow_above, shrink_below=args.shrink_below, startup_s=args.node_startup,
                        release_after=args.release_after)
