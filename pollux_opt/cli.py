"""The ``pollux-opt`` command line.

Subcommands register themselves in :func:`build_parser`; each handler takes the
parsed arguments and returns an exit status.  Bad input (``InvalidProblem``)
prints its message to stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

from solvers import InvalidProblem

__all__ = ["main", "build_parser"]

#: Exit status for bad input (as argparse uses for usage errors).
EXIT_INVALID = 2


def _cmd_allocate(args: argparse.Namespace) -> int:
    from ._allocate import allocate
    from ._instance import load_instance

    inst = load_instance(args.instance)
    overrides = {}
    if args.solver is not None:
        overrides["solver"] = args.solver
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.time_limit is not None:
        overrides["time_limit"] = args.time_limit
    result = allocate(inst.cluster, inst.jobs, inst.options, **overrides)
    json.dump(result.to_json(), sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pollux-opt",
        description="Goodput-optimized scheduling of deep-learning training jobs (Pollux) with an exact allocator.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("allocate", help="solve one allocation instance (JSON) and print the answer as JSON")
    p.add_argument("instance", help="instance JSON file (see docs/instance-format.md)")
    p.add_argument("--solver", help="solver name (default: the instance's, else milp)")
    p.add_argument("--seed", type=int, help="seed for randomised solvers")
    p.add_argument("--time-limit", type=float, help="solver time limit in seconds")
    p.add_argument("--pretty", action="store_true", help="indent the JSON output")
    p.set_defaults(handler=_cmd_allocate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except InvalidProblem as exc:
        print(f"pollux-opt: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print("pollux-opt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
