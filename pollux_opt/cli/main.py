"""The ``pollux-opt`` command line.

Subcommands register themselves in :func:`build_parser`; each handler takes the
parsed arguments and returns an exit status.  Bad input (``InvalidProblem``)
prints its message to stderr and exits 2, never a traceback.  Ctrl-C or
SIGTERM during ``run`` or ``demo`` checkpoints and stops the jobs, prints one
line and exits 128 + the signal number (130 for Ctrl-C); the same command
then resumes (see :mod:`pollux_opt.backends.local.run`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Sequence

from solvers import InvalidProblem
from pollux_opt.cli.options import (
    add_autoscale_args,
    add_backend_args,
    add_cluster_args,
    autoscale_from_args,
    cluster_from_args,
)
from pollux_opt.extras import MissingExtra
from pollux_opt.service.client import DEFAULT_PORT as DEMO_DASHBOARD_PORT

__all__ = ["main", "build_parser"]

#: Exit status for bad input (as argparse uses for usage errors).
EXIT_INVALID = 2
#: Exit status after Ctrl-C (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = 130
#: Time limit of ``pollux-opt allocate`` in seconds when neither ``--time-limit``
#: nor the instance sets one: no input makes the command run for ever, and a
#: minute is ample for instances of thousands of jobs (docs/instance-format.md).
DEFAULT_ALLOCATE_TIME_LIMIT_S = 60.0
#: Size of an instance file from which ``allocate`` reports each step on stderr
#: (about 9,000 jobs: seconds of checking on a loaded machine).
LARGE_INSTANCE_BYTES = 1_000_000

log = logging.getLogger("pollux_opt.cli")


def _process_start() -> float:
    """``time.monotonic()`` at this process's start (the kernel's start time on
    Linux; else now): the command's time limit also covers the interpreter's
    start and the imports, which take seconds on a loaded machine."""
    import os
    import time

    now = time.monotonic()
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0 <= age < 3600 else now


def _cmd_allocate(args: argparse.Namespace) -> int:
    """Read, check, encode and solve within one time limit (``--time-limit``, else the
    instance's ``options.time_limit``, else :data:`DEFAULT_ALLOCATE_TIME_LIMIT_S`),
    counted from the command's start (``args.started``); decoding the file's
    JSON is the one step it does not interrupt.  A file of
    :data:`LARGE_INSTANCE_BYTES` or more gets a line on stderr per step."""
    import time

    from pollux_opt.model.instance import parse_instance, read_instance_json

    start = args.started
    try:
        large = Path(args.instance).stat().st_size >= LARGE_INSTANCE_BYTES
    except OSError:
        large = False  # reading it names the problem

    def step(what: str) -> None:
        (_say if large else log.info)(f"{what} ({time.monotonic() - start:.1f} s since start)")

    step(f"reading {args.instance}")
    data = read_instance_json(args.instance)
    limit = args.time_limit if args.time_limit is not None else _instance_time_limit(data)
    step(f"checking the instance, time limit {limit:g} s for the whole command")
    inst = parse_instance(data, deadline=start + limit)
    del data
    with _frozen_heap(large):
        result = _solve_instance(args, inst, start + limit, step)
    json.dump(result.to_json(), sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")
    return 0


def _solve_instance(args: argparse.Namespace, inst, deadline: float, step):
    """The allocation of the parsed instance ``inst`` by ``deadline`` (``time.monotonic()`` seconds)."""
    import time

    from pollux_opt.model.allocate import allocate
    from solvers import OutOfTime

    if time.monotonic() >= deadline:
        raise OutOfTime(f"reading and checking {args.instance!r} took the whole time limit")
    overrides = {"time_limit": deadline - time.monotonic()}
    if args.solver is not None:
        overrides["solver"] = args.solver
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.write:
        from pollux_opt.model.allocate import to_problem
        from solvers.milp import write_model

        step(f"writing the model to {args.write}")
        write_model(to_problem(inst.cluster, inst.jobs, inst.options, deadline=deadline), args.write)
    step(f"encoding and solving {len(inst.jobs)} jobs on {len(inst.cluster.nodes)} nodes")
    result = allocate(inst.cluster, inst.jobs, inst.options, **overrides)
    step(f"answered: {result.status.value}")
    return result


@contextlib.contextmanager
def _frozen_heap(active: bool):
    """With ``active``, the objects alive now (a large parsed instance) are left
    out of the garbage collector's passes until the block ends: they live until
    the command ends, and traversing them again and again while the solver
    allocates costs seconds for a file of 200,000 jobs."""
    if not active:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _say(message: str) -> None:
    """One progress line on stderr (stdout carries the answer)."""
    print(f"pollux-opt: {message}", file=sys.stderr, flush=True)


def _instance_time_limit(data: object) -> float:
    """The instance's own finite ``options.time_limit``, else the default (the
    instance's options are checked in full when it is parsed)."""
    from pollux_opt.model.domains import Real

    options = data.get("options") if isinstance(data, dict) else None
    limit = options.get("time_limit") if isinstance(options, dict) else None
    return float(limit) if Real(gt=0).accepts(limit) else DEFAULT_ALLOCATE_TIME_LIMIT_S


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (a limit of inf never ends)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _cmd_run(args: argparse.Namespace) -> int:
    from pollux_opt.backends.local import run_workload
    from pollux_opt.workloads import load_workload

    workload = load_workload(args.workload, quick=args.quick, import_dir=args.import_dir) if args.workload else None
    cluster = cluster_from_args(args)
    interval = args.interval if args.interval is not None else _default_interval(args.quick)
    if args.backend == "ray":
        summary = _run_on_ray(args, workload, cluster, interval)
    elif args.ray_address is not None or args.checkpoint_dir is not None or args.autoscale is not None:
        raise InvalidProblem("--ray-address, --checkpoint-dir and --autoscale need --backend ray")
    else:
        summary = run_workload(args.out, workload, args.policy, cluster=cluster, interval=interval,
                               progress=not args.quiet, repair=args.repair_log)
    _print_table({args.out: summary})
    return 0


def _run_on_ray(args: argparse.Namespace, workload, cluster, interval: float) -> dict:
    """``run --backend ray``: the cluster is Ray's, so ``--nodes``/``--cpus`` do not apply."""
    from pollux_opt.backends.ray import run_ray_workload

    if cluster is not None:
        raise InvalidProblem("--nodes, --cpus, --gpus and --cluster do not apply with --backend ray: the "
                             "cluster is Ray's nodes")
    return run_ray_workload(args.out, workload, args.policy, address=args.ray_address,
                            checkpoint_dir=args.checkpoint_dir, interval=interval, progress=not args.quiet,
                            repair=args.repair_log, autoscale=autoscale_from_args(args), node_cpus=args.node_cpus)


def _cmd_list(args: argparse.Namespace) -> int:
    from pollux_opt.runtime import get_job, job_names
    from pollux_opt.scheduling.policies import registered_policies
    from pollux_opt.workloads import WORKLOAD_SETS

    rows: list[tuple[str, str, str]] = []
    if args.what in ("all", "policies"):
        for name, info in sorted(registered_policies().items()):
            needs = f" (needs: {', '.join(r.value for r in info.needs)})" if info.needs else ""
            rows.append(("policy", name, info.description + needs))
    if args.what in ("all", "jobs"):
        for name in job_names():
            spec = get_job(name)
            rows.append(("job", name, f"M0 {spec.init_batch_size}, max batch {spec.max_batch_size}"))
    if args.what in ("all", "workloads"):
        for name, workload in sorted(WORKLOAD_SETS.items()):
            rows.append(("workload", name, workload.description))
    width = max(len(name) for _, name, _ in rows)
    for kind, name, text in rows:
        print(f"{kind:<9} {name:<{width}}  {text}")
    return 0


def _default_interval(quick: bool) -> float:
    from pollux_opt.backends.local import DEFAULT_INTERVAL_S, QUICK_INTERVAL_S

    return QUICK_INTERVAL_S if quick else DEFAULT_INTERVAL_S


def _load_summary(run_dir: str) -> dict:
    from pathlib import Path

    from pollux_opt.records.events import read_events
    from pollux_opt.records.metrics import summarize

    path = Path(run_dir)
    if (path / "summary.json").exists():
        return json.loads((path / "summary.json").read_text())
    if (path / "events.jsonl").exists():
        return summarize(read_events(path / "events.jsonl"))
    raise InvalidProblem(f"{run_dir!r} holds neither summary.json nor events.jsonl")


def _print_table(summaries: dict) -> None:
    """Metrics as rows, runs as columns (fits a narrow terminal)."""
    from rich.console import Console
    from rich.table import Table

    from pollux_opt.records.metrics import compare_table

    df = compare_table(summaries).T
    table = Table()
    table.add_column("metric")
    for label in df.columns:
        table.add_column(str(label), justify="right")
    for metric, row in df.iterrows():
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append(f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}")
            else:
                cells.append("-" if v is None else str(v))
        table.add_row(str(metric), *cells)
    Console().print(table)


def _cmd_compare(args: argparse.Namespace) -> int:
    _print_table({d: _load_summary(d) for d in args.dirs})
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from pollux_opt.backends.local import run_demo

    cluster = cluster_from_args(args)
    summaries = run_demo(args.out, args.workload, quick=args.quick, interval=args.interval,
                         policies=tuple(args.policies), cluster=cluster, progress=not args.quiet,
                         import_dir=args.import_dir, service=_demo_dashboard(args.port))
    _print_table(summaries)
    print(f"plots and comparison.json in {args.out}")
    return 0


def _demo_dashboard(port: int | None):
    """What makes the service serving the dashboard of each of the demo's runs
    on this machine's ``port`` (None: none, said why unless ``port`` is None)."""
    if port is None:
        return None
    from pollux_opt.extras import SERVICE_MISSING, MissingExtra, require

    try:
        require("fastapi", SERVICE_MISSING)
        require("uvicorn", SERVICE_MISSING)
    except MissingExtra:
        print("the live dashboard needs the service extra (pip install 'pollux-opt[service]'): the demo runs "
              "without it", file=sys.stderr)
        return None
    from pollux_opt.service.server import DEFAULT_HOST, Service, port_taken

    if port_taken(DEFAULT_HOST, port):
        print(f"port {port} is taken: the demo runs without its dashboard (choose another with --port)",
              file=sys.stderr)
        return None
    print(f"dashboard: http://{DEFAULT_HOST}:{port}/ (while the demo runs)")
    return lambda: Service(host=DEFAULT_HOST, port=port, token=None, open_queue=False)


def _version() -> str:
    from pollux_opt import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    from pollux_opt.backends.local.run import DEMO_POLICIES
    from pollux_opt.scheduling.policies import policy_names

    parser = argparse.ArgumentParser(
        prog="pollux-opt",
        description="Goodput-optimized scheduling of deep-learning training jobs (Pollux) with an exact allocator.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("allocate", help="solve one allocation instance (JSON) and print the answer as JSON")
    p.add_argument("instance", help="instance JSON file (see docs/instance-format.md)")
    p.add_argument("--solver", help="solver name (default: the instance's, else milp)")
    p.add_argument("--seed", type=int, help="seed for randomised solvers")
    p.add_argument("--time-limit", type=_seconds, metavar="SECONDS",
                   help="wall-clock limit of the whole command: reading, checking, encoding and solving "
                        f"(default: the instance's options.time_limit, else {DEFAULT_ALLOCATE_TIME_LIMIT_S:g}); "
                        "a solver stopped by it answers with status time_limit")
    p.add_argument("--pretty", action="store_true", help="indent the JSON output")
    p.add_argument("--write", metavar="FILE", help="also write the exact MILP to FILE for other MILP solvers "
                   "(format by suffix: .lp or .mps; objective: the utility sum, maximised)")
    p.set_defaults(handler=_cmd_allocate)

    p = sub.add_parser("run", help="run one policy on a workload of real CPU jobs (resumes an existing --out)")
    p.add_argument("--workload", help="named workload set or workload JSON file (omit to resume --out)")
    p.add_argument("--policy", help=f"scheduling policy (new runs): {', '.join(policy_names())}")
    p.add_argument("--out", required=True, help="run directory (config.json, events.jsonl, summary.json)")
    p.add_argument("--interval", type=float, help="seconds between scheduling rounds (default 30; 10 with --quick)")
    p.add_argument("--quick", action="store_true", help="use the workload's quick variant")
    add_cluster_args(p)
    p.add_argument("--quiet", action="store_true", help="no live progress table")
    p.add_argument("--import", dest="import_dir", metavar="DIR",
                   help="directory the workload file's user jobs ('entry') are imported from (default: the file's)")
    p.add_argument("--repair-log", action="store_true",
                   help="move unreadable lines of the run's events.jsonl to events.jsonl.rejected, then resume")
    add_backend_args(p, "--out")
    add_autoscale_args(p, ray=True)
    p.set_defaults(handler=_cmd_run)

    p = sub.add_parser("compare", help="print a side-by-side table of run summaries")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run directories")
    p.set_defaults(handler=_cmd_compare)

    p = sub.add_parser("demo", help="run a workload under each of several policies (default fixed, dynamic, "
                                    "pollux); compare and plot")
    p.add_argument("--workload", default="mixed", help="named workload set or file (default: mixed)")
    p.add_argument("--policies", nargs="+", metavar="POLICY", default=list(DEMO_POLICIES),
                   help=f"policies to run, in order (default: {' '.join(DEMO_POLICIES)}; any of "
                        f"{', '.join(policy_names())})")
    p.add_argument("--quick", action="store_true", help="quick variant, 10 s rounds (about 2-3 minutes on 2 cores)")
    p.add_argument("--out", default="demo-out", help="output directory (default: demo-out)")
    p.add_argument("--interval", type=float, help="seconds between rounds (default 30; 10 with --quick)")
    add_cluster_args(p)
    p.add_argument("--quiet", action="store_true", help="no live progress table")
    p.add_argument("--import", dest="import_dir", metavar="DIR",
                   help="directory the workload file's user jobs ('entry') are imported from (default: the file's)")
    p.add_argument("--port", type=int, default=DEMO_DASHBOARD_PORT,
                   help=f"port of the live dashboard on 127.0.0.1 (default {DEMO_DASHBOARD_PORT})")
    p.add_argument("--no-dashboard", dest="port", action="store_const", const=None, help="no live dashboard")
    p.set_defaults(handler=_cmd_demo)

    p = sub.add_parser("list", help="list the registered policies, job kinds and workload sets")
    p.add_argument("what", nargs="?", default="all", choices=["all", "policies", "jobs", "workloads"])
    p.set_defaults(handler=_cmd_list)

    from pollux_opt.cli.service import add_service_parsers
    from pollux_opt.cli.simulate import add_profile_parser, add_simulate_parser

    add_simulate_parser(sub)
    add_profile_parser(sub)
    add_service_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (None: this process's command line, whose start
    is then the process's, see :func:`_process_start`); returns the exit status."""
    import time

    started = _process_start() if argv is None else time.monotonic()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.started = started
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except (InvalidProblem, MissingExtra) as exc:
        print(f"pollux-opt: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt as exc:
        # A stop signal after the jobs were checkpointed (RunInterrupted), or a
        # second one that stopped at once: one line, never a traceback, also
        # not from yet another Ctrl-C during the interpreter's teardown.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"pollux-opt: {exc or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_status", EXIT_INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
