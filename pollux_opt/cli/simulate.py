"""``pollux-opt simulate`` (run workloads through the simulator) and ``pollux-opt profile``
(export real runs as simulator profiles): handlers + parser lines."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from solvers import InvalidProblem

from pollux_opt.cli.options import autoscale_from_args

__all__ = [
    "add_profile_parser", "add_simulate_parser", "cluster_and_profiles", "cmd_profile", "cmd_simulate",
    "completion_delays", "parse_prices", "simulate_one",
]


def add_simulate_parser(sub) -> None:
    from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_INTERVAL_S, SIM_DEFAULT_NODES
    from pollux_opt.model.options import DEFAULT_RESTART_DELAY
    from pollux_opt.cli.options import add_autoscale_args
    from pollux_opt.scheduling.policies import POLICIES

    p = sub.add_parser("simulate", help="simulate workloads on a simulated cluster")
    p.add_argument("--workload", nargs="+", required=True, help="workload CSV file(s) (AdaptDL format)")
    p.add_argument("--profiles", default=None,
                   help="trace folder holding profiles/APP/ (default ../shared/traces/adaptdl-osdi21 or $POLLUX_OPT_TRACES)")
    p.add_argument("--policy", default="pollux", help=f"scheduling policy: {', '.join(POLICIES)} (default: pollux)")
    p.add_argument("--nodes", type=int, default=None,
                   help=f"number of nodes of one type (nodes x cpus per node at most MAX_SIM_CPUS = 65536; "
                        f"default {SIM_DEFAULT_NODES})")
    p.add_argument("--cpus-per-node", type=int, default=None,
                   help=f"replica slots per node (default {SIM_DEFAULT_CPUS_PER_NODE})")
    p.add_argument("--cluster", default=None,
                   help="a cluster of node types instead of --nodes/--cpus-per-node: a JSON file "
                        "(docs/node-types.md) or a preset (sia-64, aws-64)")
    p.add_argument("--typed-profiles", default=None,
                   help="with --cluster: a folder of per-type profiles in Sia's artifact layout "
                        "(APP/placements-TYPE.csv); default: synthetic types built from the trace folder's "
                        "profiles (one-type clusters: the trace folder's profiles as they are)")
    p.add_argument("--sia-calibration", action="store_true",
                   help="apply Sia's simulator calibration (per-application goodput slowdowns and restart "
                        "delays of Sia's artifact)")
    p.add_argument("--interval", type=float, default=SIM_DEFAULT_INTERVAL_S,
                   help="scheduling interval, seconds (>= 1; the last arrival within 100000 intervals)")
    p.add_argument("--restart-delay", type=float, default=DEFAULT_RESTART_DELAY, help="seconds a (re)start costs")
    p.add_argument("--interference", type=float, default=0.0, help="slowdown of multi-node jobs sharing a node")
    p.add_argument("--report-noise", type=float, default=0.0, help="log-normal sigma of measurement error")
    p.add_argument("--completion-delay", default="0",
                   help="seconds from reaching the target to completion (a real job's verification), or "
                        "'measured': per application from PROFILES/export.json (written by `pollux-opt profile`)")
    p.add_argument("--start-delay", default=None,
                   help="seconds a job's first start costs, or 'measured' (per application, from "
                        "PROFILES/export.json); default: the restart delay")
    p.add_argument("--split-single", action="store_true",
                   help="run a one-replica job's batch as two micro-batches, as the real executor does")
    p.add_argument("--wake-every", type=float, default=None,
                   help="start the next round early once a job arrives or finishes, checking this often "
                        "(seconds), as a real run does; default: fixed rounds, as Pollux's simulator")
    p.add_argument("--fixed-apps", nargs="*", default=None, metavar="APP",
                   help="applications whose jobs are not elastic: under every policy they run at their "
                        "profile's tuned configuration (one replica at the tuned batch size), whatever the "
                        "workload row says (default: ncf, as Pollux's simulator; give none to make every job "
                        "elastic)")
    add_autoscale_args(p, ray=False)
    p.add_argument("--node-cost", nargs="+", default=None, metavar="TYPE=PRICE",
                   help="price per node-hour of a node type (the summary's cost; the autoscaler adds the "
                        "type whose extra goodput per price is highest); one-type clusters' type: default")
    p.add_argument("--out", required=True, help="output folder (one run dir per workload)")
    p.add_argument("--jobs", type=int, default=1, help="workloads simulated in parallel processes")
    p.set_defaults(handler=cmd_simulate)


def parse_prices(items: list[str] | None) -> dict[str, float] | None:
    """``--node-cost TYPE=PRICE ...`` as ``{type: price}`` (None without it)."""
    if not items:
        return None
    prices = {}
    for item in items:
        name, sep, price = item.partition("=")
        try:
            prices[name] = float(price)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise InvalidProblem(f"--node-cost must be TYPE=PRICE (a price per node-hour), got {item!r}")
    return prices


def cluster_and_profiles(cluster: str | None, nodes: int | None, cpus_per_node: int | None,
                         profiles: str | None, typed_profiles: str | None, *, apps: Sequence[str] | None = None):
    """The simulated cluster and its profiles: ``nodes x cpus_per_node`` of one type
    with the trace folder's profiles, or a cluster description (preset or JSON
    file) with per-type profiles (``typed_profiles`` in Sia's layout, else
    synthetic types built from the trace folder; a one-type description with the
    trace folder's profiles as they are).  ``apps``: the applications the
    workload runs; per-type profiles are read for those only (a published
    folder may hold applications measured on some types only)."""
    from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_NODES
    from pollux_opt.backends.sim.profile_files import load_profiles, load_typed_profiles
    from pollux_opt.backends.sim.synthetic_types import build_typed_profiles
    from pollux_opt.model import Cluster
    from pollux_opt.model.cluster_types import load_cluster_types

    if cluster is None:
        if typed_profiles is not None:
            raise InvalidProblem("--typed-profiles needs --cluster (the node types to read)")
        shape = (SIM_DEFAULT_NODES if nodes is None else nodes,
                 SIM_DEFAULT_CPUS_PER_NODE if cpus_per_node is None else cpus_per_node)
        return Cluster.uniform(*shape), load_profiles(profiles)
    if nodes is not None or cpus_per_node is not None:
        raise InvalidProblem(f"give --cluster or --nodes/--cpus-per-node, not both (got --cluster {cluster!r})")
    types = load_cluster_types(cluster)
    typed = Cluster.from_types(types)
    if typed_profiles is not None:
        return typed, load_typed_profiles(typed_profiles, apps, types=types.names)
    if len(types.names) == 1:
        return typed, load_profiles(profiles)
    return typed, build_typed_profiles(profiles, types=types.names)


def simulate_one(args: dict) -> dict:
    """Top-level (picklable) entry point: simulate one workload; returns the result as a dict."""
    from pollux_opt.backends.sim.run import simulate
    from pollux_opt.backends.sim.state import PAPER_FIXED_APPLICATIONS, SiaSimSettings, SimConfig
    from pollux_opt.workloads.adaptdl import read_adaptdl_csv

    jobs = read_adaptdl_csv(args["workload"])
    cluster, profiles = cluster_and_profiles(args.get("cluster"), args["nodes"], args["cpus_per_node"],
                                             args["profiles"], args.get("typed_profiles"),
                                             apps=sorted({j.kind for j in jobs}))
    config = SimConfig(restart_delay=args["restart_delay"], interference=args["interference"],
                       report_noise=args["report_noise"], completion_delay=args["completion_delay"],
                       wake_every=args["wake_every"], start_delay=args["start_delay"],
                       split_single=args["split_single"],
                       fixed_applications=tuple(PAPER_FIXED_APPLICATIONS if args["fixed_apps"] is None
                                                else args["fixed_apps"]),
                       sia=SiaSimSettings(enabled=bool(args.get("sia_calibration"))))
    result = simulate(
        jobs, profiles, args["policy"], cluster=cluster,
        interval=args["interval"], config=config, out_dir=args["out_dir"],
        autoscale=args.get("autoscale"), prices=args.get("prices"),
    )
    return asdict(result)


def completion_delays(value: str, profiles: str | None, *, option: str = "--completion-delay",
                      field: str = "verify_seconds") -> float | dict[str, float]:
    """``--completion-delay`` (or ``--start-delay`` with ``field="start_seconds"``):
    a number of seconds, or ``"measured"``: each application's ``field`` from
    ``profiles/export.json`` (0 where none)."""
    if value == "measured":
        path = Path(profiles or ".") / "export.json"
        if profiles is None or not path.is_file():
            raise InvalidProblem(
                f"{option} measured needs --profiles with an export.json "
                f"(written by `pollux-opt profile`); {str(path)!r} does not exist"
            )
        return _measured(path, field)
    try:
        return float(value)
    except ValueError:
        raise InvalidProblem(f"{option} must be a number of seconds or 'measured', got {value!r}") from None


def _measured(path: Path, field: str) -> dict[str, float]:
    """Each application's ``field`` (seconds; 0 where absent or null) from an export.json."""
    from pollux_opt.model.domains import Real, check
    from pollux_opt.model.validate import read_json

    apps = read_json(path, "export file")
    if not isinstance(apps, dict) or not all(isinstance(a, dict) for a in apps.values()):
        raise InvalidProblem(f"export file {str(path)!r} must map application names to objects "
                             f"(as `pollux-opt profile` writes it)")
    seconds = Real(ge=0, unit="seconds")
    return {name: float(check(f"{name}.{field}", a.get(field) or 0.0, seconds, prefix=f"{path.name}: "))
            for name, a in apps.items()}


def _check_simulate_args(args: argparse.Namespace) -> None:
    """The cluster, interval, workers and output folder asked for, checked before any work."""
    from pollux_opt.backends.sim.run import MAX_SIM_CPUS, MIN_INTERVAL_S
    from pollux_opt.model.cluster_types import load_cluster_types
    from pollux_opt.model.domains import Integer, Real, check

    from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_NODES

    nodes = SIM_DEFAULT_NODES if args.nodes is None else args.nodes
    cpus = SIM_DEFAULT_CPUS_PER_NODE if args.cpus_per_node is None else args.cpus_per_node
    check("--nodes", nodes, Integer(ge=1))
    check("--cpus-per-node", cpus, Integer(ge=1))
    if nodes * cpus > MAX_SIM_CPUS:
        raise InvalidProblem(f"--nodes x --cpus-per-node must be at most MAX_SIM_CPUS = {MAX_SIM_CPUS}, "
                             f"got {nodes} x {cpus}")
    if args.cluster is not None:
        if args.nodes is not None or args.cpus_per_node is not None:
            raise InvalidProblem(f"give --cluster or --nodes/--cpus-per-node, not both "
                                 f"(got --cluster {args.cluster!r})")
        load_cluster_types(args.cluster)  # a bad description fails before any work
    check("--interval", args.interval, Real(ge=MIN_INTERVAL_S, unit="seconds"))
    from pollux_opt.model import Cluster
    from pollux_opt.scheduling.autoscale import node_prices

    largest = (Cluster.uniform(nodes, cpus) if args.cluster is None
               else Cluster.from_types(load_cluster_types(args.cluster)))
    scale = autoscale_from_args(args)
    if scale is not None and scale.max_nodes > len(largest.nodes):
        raise InvalidProblem(f"--autoscale {args.autoscale}: MAX must be at most the cluster's nodes "
                             f"(--nodes or --cluster), {len(largest.nodes)}")
    node_prices(parse_prices(args.node_cost), largest)
    check("--jobs", args.jobs, Integer(ge=1))
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise InvalidProblem(f"--out {args.out!r} is an existing file; give a folder (it is created if missing)")
    for w in args.workload:
        if not Path(w).is_file():
            raise InvalidProblem(f"--workload file {w!r} does not exist")


def cmd_simulate(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from pollux_opt.backends.sim.run import run_tasks
    from pollux_opt.records.files import safe_name

    _check_simulate_args(args)
    delay = completion_delays(args.completion_delay, args.profiles)
    start = None if args.start_delay is None else completion_delays(
        args.start_delay, args.profiles, option="--start-delay", field="start_seconds")
    out = Path(args.out)
    single = len(args.workload) == 1
    tasks = []
    for w in args.workload:
        run_dir = out if single else out / safe_name("workload file name", Path(w).stem)
        tasks.append({
            "workload": w, "profiles": args.profiles, "policy": args.policy, "nodes": args.nodes,
            "cpus_per_node": args.cpus_per_node, "interval": args.interval,
            "restart_delay": args.restart_delay, "interference": args.interference,
            "report_noise": args.report_noise, "completion_delay": delay, "wake_every": args.wake_every,
            "start_delay": start, "split_single": args.split_single, "fixed_apps": args.fixed_apps,
            "cluster": args.cluster, "typed_profiles": args.typed_profiles,
            "sia_calibration": args.sia_calibration, "out_dir": str(run_dir),
            "autoscale": autoscale_from_args(args), "prices": parse_prices(args.node_cost),
        })
    with Progress(transient=False) as bar:
        task = bar.add_task(f"simulate {args.policy}", total=len(tasks))
        done = run_tasks(simulate_one, tasks, jobs=args.jobs, on_result=lambda t, r: bar.advance(task))
    results = {t["workload"]: r for t, r in zip(tasks, done)}
    json.dump({w: {k: r[k] for k in ("policy", "completed", "avg_jct", "p99_jct", "makespan", "node_hours", "cost",
                                     "wall_seconds", "out_dir")}
               for w, r in results.items()}, sys.stdout, indent=2, default=lambda x: None)
    sys.stdout.write("\n")
    return 0


def add_profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="export real runs' measurements as simulator profiles (AdaptDL format)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directories of `pollux-opt run` (or a demo output folder holding them)")
    p.add_argument("--out", required=True, help="profiles folder to write (one APP/ folder per application)")
    p.add_argument("--app", nargs="+", default=None, help="only these applications (default: all found)")
    p.set_defaults(handler=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    from pollux_opt.backends.sim.export import export_profiles

    result = export_profiles(args.run_dirs, args.out, apps=args.app)
    json.dump({name: {**asdict(a), "jobs": list(a.jobs)} for name, a in result.items()}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
