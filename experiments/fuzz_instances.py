"""Fuzz ``pollux-opt allocate`` and :func:`pollux_opt.allocate` with generated instance files.

Each case is a seeded instance file: most are valid, the rest carry one or
two hostile values (a count of ``10**400``, a string where a number belongs,
``p`` outside its range, a null id, ...) or hostile bytes (truncated, a stray
``0xff``, UTF-16, deep nesting).  Each case runs through the Python API and
through the command line, and is counted as

* a **traceback**: any exception but :class:`pollux_opt.InvalidProblem` from
  the API, or a CLI exit status other than 0 and 2, or "Traceback" on its stderr;
* a **hang**: a case that took longer than its time limit plus
  :data:`HANG_SLACK_S`;
* a **wrong status**: an answer whose placement breaks a constraint while its
  status claims a solution, an ``optimal`` answer worse than the greedy
  solver's, or a ``time_limit`` answer without a feasible placement.

Usage::

    python experiments/fuzz_instances.py --in-process        # 600 cases, CLI in this process
    python experiments/fuzz_instances.py --cases 100         # 100 cases, CLI as subprocesses
    python experiments/fuzz_instances.py --cases 50 --out /tmp/fuzz.csv

writes one row of counts per front end (``api``, ``cli``) and mode (the CLI
in-process or as subprocesses; the rows of the other mode are kept) to
``experiments/results/fuzz.csv``, also every :data:`PROGRESS_EVERY` cases;
``experiments/results_doc.py`` reports it.
The quick in-process variant runs in the default test suite
(``tests/cli/test_fuzz_instances.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

log = logging.getLogger("fuzz_instances")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "experiments" / "results" / "fuzz.csv"
#: Time limit given to every case (seconds): small instances solve in milliseconds.
CASE_TIME_LIMIT_S = 5.0
#: A case counts as a hang when it runs this much past its time limit
#: (seconds): interpreter start-up of a CLI subprocess and JAX compilation fit in it.
HANG_SLACK_S = 30.0
#: Relative tolerance of "an optimal answer is no worse than greedy's" (the MIP gap is 1e-4).
OPTIMAL_TOLERANCE = 1e-3
#: Cases between two progress reports (and partial CSVs) of :func:`main`.
PROGRESS_EVERY = 25
#: Solvers a case may name: the exact one most often, as in practice.
SOLVERS = ("milp", "milp", "milp", "greedy")

#: Hostile values, by the kind of field they are tried in.
HOSTILE_COUNTS = [0, -1, 2**31, 2**63, 10**400, "4", None, 1.5, True, [4], {"n": 4}]
HOSTILE_NUMBERS = [math.nan, math.inf, -math.inf, -1, 10**400, 1e308, "1", None, True, []]
HOSTILE_IDS = [None, 7, "", "a" * 10_000, ["a"], True]


@dataclass
class Counts:
    """Counts over the cases of one front end."""

    cases: int = 0
    answered: int = 0
    rejected: int = 0
    tracebacks: int = 0
    hangs: int = 0
    wrong: int = 0
    max_seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    def note(self, kind: str, seed: int, text: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 10:
            self.examples.append(f"seed {seed}: {kind}: {text[:300]}")


def _table(rng: random.Random, max_replicas: int) -> list[list[Any]]:
    rows, seen = [], set()
    for _ in range(rng.randint(0, 6)):
        k = rng.randint(1, max(1, min(max_replicas, 12)))
        n = rng.randint(1, k)
        if (n, k) not in seen:
            seen.add((n, k))
            rows.append([n, k, round(rng.uniform(0.1, 1.0) * k, 3)])
    return rows


def valid_instance(rng: random.Random) -> dict:
    """A valid instance of up to 5 nodes and 6 jobs (some running, some weighted)."""
    nodes = [{"id": f"n{i}", "cpus": rng.choice([1, 2, 4, 8, 64, 10**5])} for i in range(rng.randint(1, 5))]
    jobs = []
    for j in range(rng.randint(0, 6)):
        mr = rng.randint(0, 12)
        job: dict[str, Any] = {"id": f"j{j}", "speedup_table": _table(rng, mr), "max_replicas": mr}
        if rng.random() < 0.3:
            job["min_replicas"] = rng.randint(0, mr)
        if rng.random() < 0.3:
            node = rng.choice(nodes)
            job["placement"] = {node["id"]: rng.randint(0, min(node["cpus"], 2))}
        if rng.random() < 0.3:
            job.update(restarts=rng.randint(0, 5), age=rng.uniform(0, 1e4), weight=rng.choice([0.5, 1, 2, 1e-6, 1e6]))
        jobs.append(job)
    options: dict[str, Any] = {"p": rng.choice([-5, -1, -0.5, 0, 1e-13, 0.5, 1, 5])}
    if rng.random() < 0.3:
        options["max_nodes_per_job"] = rng.choice([1, 2, 16, 5000])
    if rng.random() < 0.3:
        options["interference_avoidance"] = rng.random() < 0.5
    return {"version": rng.choice([1, 2]), "cluster": {"nodes": nodes}, "jobs": jobs, "options": options}


def _set_random_field(rng: random.Random, data: dict) -> None:
    """Put one hostile value into one field of ``data``."""
    jobs, nodes = data["jobs"], data["cluster"]["nodes"]
    choices: list[Callable[[], None]] = [
        lambda: nodes[0].__setitem__("cpus", rng.choice(HOSTILE_COUNTS)),
        lambda: nodes[0].__setitem__("id", rng.choice(HOSTILE_IDS)),
        lambda: data["options"].__setitem__("p", rng.choice(HOSTILE_NUMBERS + [-6, 6, 1e300])),
        lambda: data["options"].__setitem__("max_nodes_per_job", rng.choice(HOSTILE_COUNTS)),
        lambda: data["options"].__setitem__("time_limit", rng.choice(HOSTILE_NUMBERS)),
        lambda: data["options"].__setitem__("mip_gap", rng.choice(HOSTILE_NUMBERS)),
        lambda: data["options"].__setitem__("seed", rng.choice(HOSTILE_COUNTS)),
        lambda: data.__setitem__("version", rng.choice([True, 0, 3, "2", None, 2.0])),
        lambda: data.__setitem__(rng.choice(["cluster", "jobs", "options"]), rng.choice([None, [], {}, "x", 3])),
    ]
    if jobs:
        job = rng.choice(jobs)
        choices += [
            lambda: job.__setitem__(rng.choice(["max_replicas", "min_replicas", "restarts"]), rng.choice(HOSTILE_COUNTS)),
            lambda: job.__setitem__(rng.choice(["age", "weight"]), rng.choice(HOSTILE_NUMBERS + [1e-9, 1e9])),
            lambda: job.__setitem__("id", rng.choice(HOSTILE_IDS)),
            lambda: job.__setitem__("placement", rng.choice([{"nX": 1}, {"n0": 10**6}, [], "n0", {"n0": -1}])),
            lambda: job.__setitem__("speedup_table", rng.choice(
                [None, [[1, 1]], [[2, 1, 1.0]], [[1, 1, math.nan]], [[1, 1, 1e12]], [[1, 1, 1.0]] * 2, "x"])),
            lambda: job.__setitem__("bogus", 1),
            lambda: jobs.append(dict(job)),  # a duplicate id
        ]
    rng.choice(choices)()


def _hostile_bytes(rng: random.Random, raw: bytes) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return raw[: rng.randrange(len(raw))]
    if kind == 1:
        i = rng.randrange(len(raw))
        return raw[:i] + b"\xff" + raw[i:]
    if kind == 2:
        return raw.decode().encode("utf-16")
    if kind == 3:
        return b"[" * rng.choice([1000, 100_000]) + b"]" * 10
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    return raw.replace(b'"cpus": ', b'"cpus": ' + b"9" * rng.choice([400, 5000]), 1)


def generate_case(seed: int) -> tuple[bytes, float, str]:
    """``(file bytes, time limit, solver)`` of case ``seed``: about 60 % valid,
    30 % with hostile values, 10 % with hostile bytes."""
    rng = random.Random(seed)
    data = valid_instance(rng)
    roll = rng.random()
    if 0.6 <= roll < 0.9:
        for _ in range(rng.randint(1, 2)):
            try:
                _set_random_field(rng, data)
            except (AttributeError, TypeError, IndexError, KeyError):  # an earlier value replaced a container
                pass
    raw = json.dumps(data).encode()
    if roll >= 0.9:
        raw = _hostile_bytes(rng, raw)
    return raw, CASE_TIME_LIMIT_S, rng.choice(SOLVERS)


def check_answer(inst, answer: dict, solver: str) -> str | None:
    """What is wrong with an answer (JSON of :meth:`Allocation.to_json`) to ``inst``, or None."""
    from pollux_opt.model import to_problem
    from solvers import evaluate, solve, violations

    problem = to_problem(inst.cluster, list(inst.jobs), inst.options)
    ids = inst.cluster.node_ids
    x = np.array([[answer["placement"][j.id].get(n, 0) for n in ids] for j in inst.jobs], dtype=np.int64)
    x = x.reshape(problem.num_jobs, problem.num_nodes)
    status = answer["status"]
    if status in ("optimal", "feasible", "time_limit"):
        broken = violations(problem, x)
        if broken:
            return f"status {status} with an infeasible placement: {broken[0]}"
    if status == "optimal":
        greedy = solve(problem, "greedy").objective
        if evaluate(problem, x) < greedy * (1 - OPTIMAL_TOLERANCE) - 1e-12:
            return f"optimal objective {evaluate(problem, x)!r} below greedy's {greedy!r}"
    if status not in ("optimal", "feasible", "time_limit", "time_limit_no_solution", "infeasible"):
        return f"status {status} ({solver})"
    return None


def run_api(raw: bytes, limit: float, solver: str, path: Path) -> tuple[str, str]:
    """``(outcome, detail)`` of one case through :func:`pollux_opt.allocate`:
    outcome "answered", "rejected", "traceback" or "wrong"."""
    from pollux_opt import InvalidProblem, allocate, load_instance

    path.write_bytes(raw)
    try:
        inst = load_instance(path)
        alloc = allocate(inst.cluster, inst.jobs, inst.options, solver=solver, time_limit=limit)
    except InvalidProblem as exc:
        return "rejected", str(exc)
    except Exception as exc:  # noqa: BLE001 - counting these is the point
        return "traceback", f"{type(exc).__name__}: {exc}"
    wrong = check_answer(inst, alloc.to_json(), solver)
    return ("wrong", wrong) if wrong else ("answered", alloc.status.value)


def run_cli(raw: bytes, limit: float, solver: str, path: Path, *, subprocess_cli: bool) -> tuple[str, str]:
    """``(outcome, detail)`` of one case through ``pollux-opt allocate`` (in-process or a subprocess)."""
    from pollux_opt import InvalidProblem, load_instance

    path.write_bytes(raw)
    argv = ["allocate", str(path), "--time-limit", f"{limit:g}", "--solver", solver]
    if subprocess_cli:
        flags = ["-P"] if sys.flags.safe_path else []  # the same import path as this process
        proc = subprocess.run([sys.executable, *flags, "-m", "pollux_opt", *argv], capture_output=True, text=True,
                              timeout=limit + HANG_SLACK_S * 2)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        from pollux_opt.cli.main import main

        out_buf, err_buf = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out_buf), contextlib.redirect_stderr(err_buf):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code
            except Exception as exc:  # noqa: BLE001
                code, err_buf = None, io.StringIO(f"Traceback: {type(exc).__name__}: {exc}")
        out, err = out_buf.getvalue(), err_buf.getvalue()
    if code not in (0, 2) or "Traceback" in err:
        return "traceback", f"exit {code}: {err[-300:]}"
    if code == 2:
        return "rejected", err.strip()
    try:
        answer = json.loads(out)
        inst = load_instance(path)
    except (ValueError, InvalidProblem) as exc:
        return "wrong", f"exit 0 but {exc}"
    wrong = check_answer(inst, answer, solver)
    return ("wrong", wrong) if wrong else ("answered", answer["status"])


def run_cases(seeds: Sequence[int], *, subprocess_cli: bool = False,
              on_progress: Callable[[int, dict[str, Counts]], None] | None = None) -> dict[str, Counts]:
    """Counts per front end over the cases ``seeds``; ``on_progress(done, counts)``
    after every :data:`PROGRESS_EVERY` cases."""
    counts = {"api": Counts(), "cli": Counts()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "instance.json"
        for done, seed in enumerate(seeds, 1):
            if on_progress is not None and done % PROGRESS_EVERY == 0:
                on_progress(done, counts)
            raw, limit, solver = generate_case(seed)
            for front, run in (("api", run_api), ("cli", run_cli)):
                c = counts[front]
                kwargs = {"subprocess_cli": subprocess_cli} if front == "cli" else {}
                start = time.monotonic()
                try:
                    outcome, detail = run(raw, limit, solver, path, **kwargs)
                except subprocess.TimeoutExpired:
                    outcome, detail = "hang", "killed past its time limit"
                seconds = time.monotonic() - start
                c.cases += 1
                c.max_seconds = max(c.max_seconds, seconds)
                if outcome == "traceback":
                    c.note("tracebacks", seed, detail)
                elif outcome == "wrong":
                    c.note("wrong", seed, detail)
                else:
                    c.answered += outcome == "answered"
                    c.rejected += outcome == "rejected"
                if outcome == "hang" or seconds > limit + HANG_SLACK_S:
                    c.note("hangs", seed, f"{seconds:.1f} s")
    return counts


def counts_frame(counts: dict[str, Counts], mode: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"front_end": front, "mode": mode, "cases": c.cases, "answered": c.answered, "rejected": c.rejected,
             "tracebacks": c.tracebacks, "hangs": c.hangs, "wrong_status": c.wrong,
             "max_case_seconds": round(c.max_seconds, 2)}
            for front, c in counts.items()
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    from pollux_opt.records.files import atomic_write_csv

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=600, help="number of generated instance files (default 600)")
    ap.add_argument("--seed", type=int, default=0, help="first case seed (default 0)")
    ap.add_argument("--in-process", action="store_true", help="run the CLI in-process instead of as subprocesses")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"CSV to write (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("pollux_opt").setLevel(logging.ERROR)
    logging.getLogger("solvers").setLevel(logging.ERROR)
    seeds = range(args.seed, args.seed + args.cases)
    mode = "in-process" if args.in_process else "subprocess"

    def write(counts: dict[str, Counts]) -> pd.DataFrame:
        # The rows of the other mode (an earlier run) are kept: one table holds both.
        df = counts_frame(counts, mode)
        if args.out.is_file():
            old = pd.read_csv(args.out)
            df = pd.concat([old[old["mode"] != mode], df], ignore_index=True)
        atomic_write_csv(args.out, df)
        return df

    def progress(done: int, counts: dict[str, Counts]) -> None:
        # A partial table after every few cases: a long run that is stopped still reports what it saw.
        write(counts)
        log.info("%d of %d cases: %s", done, args.cases,
                 {f: (c.tracebacks, c.hangs, c.wrong) for f, c in counts.items()})

    counts = run_cases(seeds, subprocess_cli=not args.in_process, on_progress=progress)
    df = write(counts)
    log.info("%s", df.to_string(index=False))
    for front, c in counts.items():
        for line in c.examples:
            log.info("%s %s", front, line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
