"""Synthetic heterogeneous profiles: per-type profile sets in Sia's layout, from the measured T4 data.

Reads the AdaptDL/Pollux T4 profiles (``../shared/traces/adaptdl-osdi21`` by
default, Apache-2.0) and writes, for every application, ``placements-T.csv``
and ``scalability-T.csv`` per type next to a copy of its ``validation-B.csv``
files under ``--out``: ``aws`` is the measured data unchanged, ``rtx``
(RTX 2080 Ti-like) and ``dgx-ext`` (A100-like) scale compute and sync times
by the documented speed ratios and re-shape rows to their node size and
memory (see ``docs/node-types.md``).  ``--out`` must lie outside the
repository: measured data is never copied into it::

    python experiments/make_typed_profiles.py --out /tmp/typed-profiles
    python experiments/make_typed_profiles.py --out /tmp/h --apps cifar10 ncf --types aws rtx
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pollux_opt.backends.sim import default_trace_dir  # noqa: E402
from pollux_opt.backends.sim.synthetic_types import (  # noqa: E402
    SYNTHETIC_TYPES,
    speed_ratios,
    write_typed_profiles,
)

log = logging.getLogger("make_typed_profiles")

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder (outside the repository)")
    ap.add_argument("--traces", type=Path, default=None,
                    help="AdaptDL-format profiles (default: $POLLUX_OPT_TRACES or ../shared/traces/adaptdl-osdi21)")
    ap.add_argument("--apps", nargs="+", default=None, help="applications (default: all)")
    ap.add_argument("--types", nargs="+", default=list(SYNTHETIC_TYPES), help="types to write")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = args.out.resolve()
    if out == REPO or REPO in out.parents:
        ap.error(f"--out must lie outside the repository ({REPO}), got {out}")
    traces = args.traces or default_trace_dir()
    for t in args.types:
        if t != "aws":
            r = speed_ratios(t)
            log.info("%s: compute x%.2f, intra-node sync x%.2f, inter-node sync x%.2f faster than aws",
                     t, r.compute, r.intra_sync, r.inter_sync)
    written = write_typed_profiles(traces, out, names=args.apps, types=args.types)
    log.info("wrote %d application folders under %s", len(written), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
