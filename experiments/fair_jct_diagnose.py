"""Where a simulated run's mean JCT goes, per application: from ``simulate --out`` folders.

For each run folder (``events.jsonl`` as written by ``pollux-opt simulate`` or
``experiments/fair_jct.py``) and each application: its jobs, mean JCT and share
of the run's summed JCT, mean wait from submission to the first allocation,
mean restarts (rescales) and the seconds they took (rescale begin to end),
and the mean and largest replica count over the rounds a job held replicas.
Writes ``OUT/fair_jct_diagnosis.csv``.

    python experiments/fair_jct_diagnose.py --out experiments/results --runs pollux=DIR fair-jct=DIR2
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict
from pathlib import Path

import pandas as pd

from pollux_opt.records.files import atomic_write_csv

log = logging.getLogger("fair_jct_diagnose")


def diagnose(events_path: Path) -> pd.DataFrame:
    """Per application of one run: the figures of the module docstring."""
    sub, start, end, app = {}, {}, {}, {}
    restarts, restart_s, began = defaultdict(int), defaultdict(float), {}
    replicas = defaultdict(list)
    last_t = 0.0
    with events_path.open() as fh:
        for line in fh:
            e = json.loads(line)
            j, t, kind = e.get("job_id"), float(e["t"]), e["type"]
            last_t = t
            if kind == "submit":
                sub[j], app[j] = t, e.get("application", str(j).rsplit("-", 1)[0])
            elif kind == "start":
                start.setdefault(j, t)
            elif kind == "complete":
                end[j] = t
            elif kind == "rescale_begin":
                restarts[j] += 1
                began[j] = t
            elif kind == "rescale_end" and j in began:
                restart_s[j] += t - began.pop(j)
            elif kind == "allocation":
                for jid, placement in e["placement"].items():
                    k = sum(placement.values())
                    if k:
                        replicas[jid].append(k)
    rows = []
    for j in sub:
        done = end.get(j, last_t)
        ks = replicas.get(j, [0])
        rows.append({"application": app[j], "jct_s": done - sub[j], "wait_s": start.get(j, done) - sub[j],
                     "restarts": restarts[j], "restart_s": restart_s[j], "mean_replicas": sum(ks) / len(ks),
                     "max_replicas": max(ks)})
    df = pd.DataFrame(rows)
    total = df.jct_s.sum()
    out = df.groupby("application").agg(jobs=("jct_s", "size"), mean_jct_s=("jct_s", "mean"),
                                         wait_s=("wait_s", "mean"), restarts=("restarts", "mean"),
                                         restart_s=("restart_s", "mean"), mean_replicas=("mean_replicas", "mean"),
                                         max_replicas=("max_replicas", "mean"))
    out.insert(2, "share_of_mean", df.groupby("application").jct_s.sum() / total)
    out.loc["all"] = [len(df), df.jct_s.mean(), 1.0, df.wait_s.mean(), df.restarts.mean(), df.restart_s.mean(),
                      df.mean_replicas.mean(), df.max_replicas.mean()]
    return out.reset_index()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=DIR",
                    help="run name and its simulate --out folder (e.g. pollux-w6=runs/w6-pollux)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parts = []
    for spec in args.runs:
        name, sep, folder = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--runs entries are NAME=DIR, got {spec!r}")
        parts.append(diagnose(Path(folder) / "events.jsonl").assign(run=name))
    df = pd.concat(parts, ignore_index=True)
    df = df[["run"] + [c for c in df.columns if c != "run"]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(out / "fair_jct_diagnosis.csv", df)
    log.info("\n%s", df.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
