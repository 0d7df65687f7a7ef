"""The service's commands: ``pollux-opt serve`` (run the scheduler as a
service) and its clients ``submit``, ``jobs``, ``job``, ``logs``, ``cancel``
and ``set`` (handlers + parser lines).

The client commands talk to the server at ``--server URL`` (else
``$POLLUX_OPT_SERVER``, else :data:`~pollux_opt.service.client.DEFAULT_SERVER`)
with the token of ``--token-file F`` (else ``$POLLUX_OPT_TOKEN``); see
:mod:`pollux_opt.service.client`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from solvers import InvalidProblem

from pollux_opt.cli.options import (
    add_autoscale_args,
    add_backend_args,
    add_cluster_args,
    autoscale_from_args,
    cluster_from_args,
)


__all__ = ["add_service_parsers", "job_entry", "job_lines", "jobs_table"]

#: CPUs a job is submitted with unless ``--replicas`` says otherwise (the
#: elastic policies rescale it; the fixed ones run it as submitted).
DEFAULT_REPLICAS = 1
#: Spec fields the submit flags set (flag destination -> JobSpec field).
_SPEC_FLAGS = ("epochs", "target", "metric", "progress_target", "init_batch_size", "max_batch_size")
#: Job fields ``pollux-opt job`` shows first, in this order (the rest follow sorted).
_JOB_ORDER = ("id", "name", "kind", "entry", "state", "reason", "cancelling", "weight", "submitted_unix", "start_t",
              "end_t", "eta_s", "replicas", "nodes", "placement", "batch_size", "local_bsz", "accum_steps",
              "goodput", "goodput_base", "speedup", "progress", "step", "restarts", "metric", "final_metric",
              "verified", "spec")
#: Job fields holding Unix times (shown as local date and time).
_UNIX_FIELDS = frozenset({"submitted_unix", "submit_t", "start_t", "end_t"})
#: Numbers shown whole from here on (four significant digits would switch to exponents).
LARGE_NUMBER = 10_000
#: The lifecycle's terminal states (as :class:`pollux_opt.lifecycle.JobState` names them).
_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def add_service_parsers(sub) -> None:
    """Add ``serve``, ``submit``, ``jobs``, ``job``, ``logs``, ``cancel`` and ``set`` to ``sub``."""
    _add_serve_parser(sub)
    _add_submit_parser(sub)
    _add_query_parsers(sub)


def _add_client_options(p: argparse.ArgumentParser) -> None:
    from pollux_opt.service.client import DEFAULT_SERVER, SERVER_ENV, TOKEN_ENV

    p.add_argument("--server", metavar="URL",
                   help=f"the service's URL (default: ${SERVER_ENV}, else {DEFAULT_SERVER})")
    p.add_argument("--token-file", metavar="F", help=f"file holding the service's bearer token (default: ${TOKEN_ENV})")


def _add_serve_parser(sub) -> None:
    from pollux_opt.backends.local import DEFAULT_INTERVAL_S
    from pollux_opt.scheduling.policies import policy_names
    from pollux_opt.service.client import DEFAULT_HOST, DEFAULT_PORT

    p = sub.add_parser("serve", help="run the scheduler as a service: jobs come and go through its HTTP API")
    p.add_argument("--state", required=True, metavar="DIR",
                   help="state directory (service.db, events.jsonl, jobs/ID/logs); an existing one resumes")
    add_backend_args(p, "--state")
    add_autoscale_args(p, ray=True)
    add_cluster_args(p)
    p.add_argument("--policy", help=f"scheduling policy of a new state directory: {', '.join(policy_names())} "
                                    "(default: pollux; a resumed one keeps its own)")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="S",
                   help=f"seconds between scheduling rounds (default {DEFAULT_INTERVAL_S:g}; a submission or an "
                        "ending job starts one early)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}; any other needs --token-file)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--token-file", metavar="F", help="file holding the bearer token clients must send")
    p.add_argument("--cancel-grace", type=float, metavar="S",
                   help="seconds a cancelled job gets to checkpoint before it is stopped (default: the server's, 30)")
    p.add_argument("--progress", action="store_true", help="show the live progress table of the jobs")
    p.set_defaults(handler=_cmd_serve)


def _add_submit_parser(sub) -> None:
    p = sub.add_parser("submit", help="submit a job to the service; prints its id")
    p.add_argument("entry", metavar="ENTRY",
                   help="script.py:function, package.module:function, or a registered job kind "
                        "(`pollux-opt list jobs`)")
    p.add_argument("--spec-file", metavar="F", help="JSON object of JobSpec fields; the flags below override it")
    p.add_argument("--epochs", type=int, help="complete after this many epochs")
    p.add_argument("--target", type=float, metavar="X", help="complete once the validation metric reaches X")
    p.add_argument("--metric", metavar="M", help="name of the validation metric of --target")
    p.add_argument("--lower-is-better", dest="higher_is_better", action="store_false", default=None,
                   help="the target is reached when the metric is at most X (default: at least X)")
    p.add_argument("--progress-target", type=float, metavar="P",
                   help="complete after P iterations at the initial batch size")
    p.add_argument("--init-batch-size", type=int, metavar="B",
                   help="M0: the total batch (samples) the job's hyper-parameters were tuned for")
    p.add_argument("--max-batch-size", type=int, metavar="B", help="largest total batch (samples)")
    p.add_argument("--replicas", type=int, default=DEFAULT_REPLICAS,
                   help=f"CPUs the job is submitted with (default {DEFAULT_REPLICAS})")
    p.add_argument("--batch-size", type=int, metavar="B",
                   help="total batch the job is submitted with (default: its initial batch size)")
    p.add_argument("--min-replicas", type=int, help="fewest CPUs the job accepts (default 1)")
    p.add_argument("--max-replicas", type=int, help="most CPUs the job accepts (default: the cluster's)")
    p.add_argument("--weight", type=float, help="the job's priority (default 1)")
    p.add_argument("--name", help="a name to show in `pollux-opt jobs`")
    p.add_argument("--import", dest="import_dir", metavar="DIR",
                   help="directory an entry is imported from (default: the current directory)")
    _add_client_options(p)
    p.set_defaults(handler=_cmd_submit)


def _add_query_parsers(sub) -> None:
    from pollux_opt.lifecycle import JobState

    p = sub.add_parser("jobs", help="list the service's jobs (TIME: runtime since the first start, or the age of "
                                    "a job that never started)")
    p.add_argument("--state", choices=[s.value for s in JobState], help="only the jobs in this state")
    p.add_argument("--json", action="store_true", help="print the jobs as JSON")
    p.set_defaults(handler=_cmd_jobs)
    p = sub.add_parser("job", help="show one job's fields and state transitions")
    p.add_argument("id", metavar="ID", help="the job's id")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.set_defaults(handler=_cmd_job)
    p = sub.add_parser("logs", help="print a job's worker log")
    p.add_argument("id", metavar="ID", help="the job's id")
    p.add_argument("--rank", type=int, default=0, help="the worker's rank (default 0)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing as the log grows, until the job ends")
    p.set_defaults(handler=_cmd_logs)
    p = sub.add_parser("cancel", help="cancel a job (it checkpoints, then stops)")
    p.add_argument("id", metavar="ID", help="the job's id")
    p.set_defaults(handler=_cmd_cancel)
    p = sub.add_parser("set", help="change a job's priority")
    p.add_argument("id", metavar="ID", help="the job's id")
    p.add_argument("--weight", type=float, required=True, help="the new weight")
    p.set_defaults(handler=_cmd_set)
    for name in ("jobs", "job", "logs", "cancel", "set"):
        _add_client_options(sub.choices[name])


# ----------------------------------------------------------------- handlers
def _cmd_serve(args: argparse.Namespace) -> int:
    """Run the service until SIGINT or SIGTERM (:func:`pollux_opt.service.server.serve`)."""

    if args.backend == "ray":
        if any(getattr(args, f) is not None for f in ("cluster", "nodes", "cpus", "gpus")):
            raise InvalidProblem("--nodes, --cpus, --gpus and --cluster do not apply with --backend ray: the "
                                 "cluster is Ray's nodes")
    elif args.ray_address is not None or args.checkpoint_dir is not None or args.autoscale is not None:
        raise InvalidProblem("--ray-address, --checkpoint-dir and --autoscale need --backend ray")
    cluster = cluster_from_args(args)
    from pollux_opt.service.server import serve  # its web stack is imported, or refused, when it serves

    options = {"cancel_grace_s": args.cancel_grace} if args.cancel_grace is not None else {}
    serve(args.state, backend=args.backend, ray_address=args.ray_address, cluster=cluster, policy=args.policy,
          interval=args.interval, host=args.host, port=args.port, token_file=args.token_file,
          checkpoint_dir=args.checkpoint_dir, progress=args.progress, autoscale=autoscale_from_args(args),
          node_cpus=args.node_cpus, **options)
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(client.submit(job_entry(args, cwd=os.getcwd()), name=args.name))
    return 0


def _cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.jobs(args.state)
    if args.json:
        print(json.dumps(jobs, indent=2))
    else:
        print("\n".join(jobs_table(jobs, now=time.time())))
    return 0


def _cmd_job(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.id)
    print(json.dumps(job, indent=2) if args.json else "\n".join(job_lines(job)))
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        for text in client.logs(args.id, rank=args.rank, follow=args.follow):
            sys.stdout.write(text)
            sys.stdout.flush()
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        answer = client.cancel(args.id)
    print(f"job {answer.get('id', args.id)}: cancel requested")
    return 0


def _cmd_set(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.set_weight(args.id, args.weight)
    print(f"job {args.id}: weight {args.weight:g} requested")
    return 0


def _client(args: argparse.Namespace):
    from pollux_opt.service.client import Client, read_token, server_url

    return Client(server_url(args.server), token=read_token(args.token_file))


# ----------------------------------------------------------------- submit
def job_entry(args: argparse.Namespace, *, cwd: str) -> dict:
    """The job entry ``submit``'s arguments describe (relative paths against ``cwd``).

    Raises:
        InvalidProblem: a malformed ENTRY, an unreadable ``--spec-file``, an
            unknown job kind, or no batch size to submit the job with.
    """
    spec = _spec(args)
    target, colon, func = args.entry.rpartition(":")
    if not colon:
        if args.import_dir is not None:
            raise InvalidProblem(f"--import applies to an entry (script.py:function or package.module:function), "
                                 f"not to the job kind {args.entry!r}")
        job: dict[str, Any] = {"kind": args.entry}
    elif not target or not func.isidentifier():
        raise InvalidProblem(f"ENTRY must be script.py:function, package.module:function or a job kind, "
                             f"got {args.entry!r}")
    else:
        if target.endswith(".py"):
            target = os.path.abspath(os.path.join(cwd, os.path.expanduser(target)))
        import_dir = os.path.abspath(os.path.join(cwd, os.path.expanduser(args.import_dir or cwd)))
        job = {"entry": f"{target}:{func}", "import_dir": import_dir}
    job.update(spec=spec, replicas=args.replicas, batch_size=_batch_size(args, job, spec))
    for key in ("min_replicas", "max_replicas", "weight"):
        if getattr(args, key) is not None:
            job[key] = getattr(args, key)
    return job


def _spec(args: argparse.Namespace) -> dict:
    """``--spec-file``'s object updated with the spec flags given."""
    spec: dict[str, Any] = {}
    if args.spec_file is not None:
        try:
            with open(args.spec_file, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, ValueError) as exc:
            raise InvalidProblem(f"--spec-file {args.spec_file!r} cannot be read as JSON: {exc}") from None
        if not isinstance(spec, dict):
            raise InvalidProblem(f"--spec-file {args.spec_file!r} must hold a JSON object of JobSpec fields, "
                                 f"got {type(spec).__name__}")
    spec.update({k: getattr(args, k) for k in (*_SPEC_FLAGS, "higher_is_better") if getattr(args, k) is not None})
    return spec


def _batch_size(args: argparse.Namespace, job: dict, spec: dict) -> int:
    """``--batch-size``, else the spec's initial batch size, else the job kind's."""
    if args.batch_size is not None:
        return args.batch_size
    if "init_batch_size" in spec:
        return spec["init_batch_size"]
    if "kind" not in job:
        raise InvalidProblem(f"entry {args.entry!r}: give its batch sizes (--init-batch-size and "
                             "--max-batch-size, or --spec-file)")
    from pollux_opt.runtime.entry import get_job, job_names

    if job["kind"] not in job_names():
        raise InvalidProblem(f"unknown job kind {job['kind']!r}; the registered ones: {', '.join(job_names())} "
                             "(or give script.py:function or package.module:function)")
    return get_job(job["kind"]).init_batch_size


# ----------------------------------------------------------------- output
def jobs_table(jobs: list[dict], *, now: float) -> list[str]:
    """The lines of ``jobs``' table (like ``squeue``): a header, then one row per job; ``now``: Unix seconds."""
    header = ("ID", "NAME", "STATE", "CPUS", "BATCH", "PROGRESS", "GOODPUT", "SPEEDUP", "RESTARTS", "TIME")
    rows = [header]
    for job in jobs:
        speedup = job.get("speedup")
        rows.append((str(job.get("id")), _job_name(job), str(job.get("state")), str(job.get("replicas", 0)),
                     _number(job.get("batch_size")), _number(job.get("progress")), _number(job.get("goodput")),
                     "-" if speedup is None else f"{speedup:.2f}x", str(job.get("restarts", 0)),
                     _duration(_job_time(job, now))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    left = {"ID", "NAME", "STATE"}
    return ["  ".join(cell.ljust(w) if name in left else cell.rjust(w)
                      for cell, w, name in zip(row, widths, header)).rstrip() for row in rows]


def job_lines(job: dict) -> list[str]:
    """``key: value`` lines of ``job``'s fields, then its transitions (oldest first)."""
    keys = [k for k in _JOB_ORDER if k in job] + sorted(set(job) - set(_JOB_ORDER) - {"transitions"})
    width = max(len(k) for k in keys)
    lines = [f"{k + ':':<{width + 1}} {_field(k, job[k])}" for k in keys]
    moves = job.get("transitions") or []
    lines.append(f"transitions: {len(moves)}")
    for move in moves:
        old = move.get("old") or "-"
        lines.append(f"  {_when(move.get('t'))}  {old} -> {move.get('new')}  ({move.get('reason') or '-'})")
    return lines


def _job_name(job: dict) -> str:
    """The job's name, else its kind, else its entry's function."""
    return str(job.get("name") or job.get("kind") or str(job.get("entry") or "-").rpartition(":")[2])


def _job_time(job: dict, now: float) -> float | None:
    """Seconds since the first start (to the end), or since submission for a job never started."""
    start, end = job.get("start_t"), job.get("end_t")
    if start is not None:
        return (end if end is not None else now) - start
    if job.get("state") in _TERMINAL or job.get("submitted_unix") is None:
        return None
    return now - job["submitted_unix"]


def _field(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in _UNIX_FIELDS:
        return _when(value)
    if key == "eta_s":
        return _duration(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _number(value: Any) -> str:
    """A number in four significant digits, whole from 10000 on (integers whole); ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        return f"{value:.4g}" if abs(value) < LARGE_NUMBER else f"{value:.0f}"
    return str(int(value)) if isinstance(value, (int, float)) and math.isfinite(value) else str(value)


def _when(unix: Any) -> str:
    """Local date and time of Unix seconds ``unix``."""
    if not isinstance(unix, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))


def _duration(seconds: float | None) -> str:
    """``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS`` (as ``squeue``); ``-`` for none."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{hours}:{minutes:02d}:{s:02d}" if hours else f"{minutes}:{s:02d}"
