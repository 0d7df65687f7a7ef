"""The service's command-line client (``submit``, ``jobs``, ``job``, ``logs``,
``cancel``, ``set``) and ``serve``'s arguments, against a fake server: a stdlib
HTTP server in a thread on a free port that records each request and answers
what the test told it to."""

from __future__ import annotations

import json
import socket
import sys
import threading
import types
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from pollux_opt.scheduling.autoscale import DEFAULT_TIME_VALUE, THRESHOLD_GROW

httpx = pytest.importorskip("httpx")

from pollux_opt.cli.main import main  # noqa: E402
from pollux_opt.cli.service import jobs_table  # noqa: E402
from pollux_opt.runtime.entry import get_job  # noqa: E402
from pollux_opt.service.client import DEFAULT_SERVER, Client, server_url  # noqa: E402

#: A job as ``GET /api/v1/jobs/{id}`` answers it (Unix times).
RUNNING = {
    "id": "3", "name": "mnist", "submitted_unix": 1_000.0, "state": "running", "reason": "placed",
    "submit_t": 1_000.0, "start_t": 1_010.0, "end_t": None, "weight": 1.0, "cancelling": False,
    "placement": {"n0": 2}, "replicas": 2, "nodes": 1, "batch_size": 64, "local_bsz": 32, "accum_steps": 0,
    "goodput": 512.5, "goodput_base": 256.25, "speedup": 2.0, "progress": 120.5, "step": 40, "restarts": 1,
    "metric": 0.91, "final_metric": None, "verified": False, "entry": None, "kind": "digits-cnn",
    "spec": {"target": 0.98}, "eta_s": 95.0,
    "transitions": [{"t": 1_000.0, "old": None, "new": "queued", "reason": "submit"},
                    {"t": 1_010.0, "old": "queued", "new": "running", "reason": "placed"}],
}
QUEUED = {**RUNNING, "id": "4", "name": None, "state": "queued", "start_t": None, "replicas": 0, "nodes": 0,
          "batch_size": None, "goodput": None, "goodput_base": None, "speedup": None, "progress": None,
          "restarts": 0, "kind": None, "entry": "/home/u/train.py:main", "transitions": []}


class FakeService:
    """Canned answers by ``(method, path)``: JSON, or a tuple of text pieces sent
    one by one; every request is recorded in ``requests``."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, object]] = {}
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.requests.append({"method": self.command, "path": parts.path, "query": parse_qs(parts.query),
                                      "headers": dict(self.headers), "body": json.loads(body) if body else None})
                status, payload = fake.answers.get((self.command, parts.path), (404, {"error": "no such path"}))
                if isinstance(payload, tuple):
                    self.send_response(status)  # text in pieces, ended by closing the connection
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.end_headers()
                    for piece in payload:
                        self.wfile.write(piece.encode())
                        self.wfile.flush()
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _answer

            def log_message(self, *args) -> None:  # quiet: pytest shows stderr of failures
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, status: int, payload: object) -> None:
        self.answers[(method, path)] = (status, payload)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service(monkeypatch):
    """A fake service; ``$POLLUX_OPT_SERVER`` points to it and no token is set."""
    fake = FakeService()
    monkeypatch.setenv("POLLUX_OPT_SERVER", fake.url)
    monkeypatch.delenv("POLLUX_OPT_TOKEN", raising=False)
    yield fake
    fake.close()


def _free_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _submitted(service, capsys, argv) -> dict:
    """Run ``submit argv`` against ``service``; the body it sent (after checking it printed the id)."""
    service.answer("POST", "/api/v1/jobs", 201, {"id": "7"})
    assert main(["submit", *argv]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == "7\n"
    (request,) = service.requests
    return request["body"]


# ----------------------------------------------------------------- submit
def test_submit_prints_the_new_id_and_sends_an_idempotency_key(service, capsys):
    body = _submitted(service, capsys, ["digits-cnn", "--name", "mine"])
    headers = {k.lower(): v for k, v in service.requests[0]["headers"].items()}
    assert uuid.UUID(headers["idempotency-key"]).version == 4
    assert body == {"kind": "digits-cnn", "spec": {}, "replicas": 1,
                    "batch_size": get_job("digits-cnn").init_batch_size, "name": "mine"}


def test_submit_of_a_relative_script_sends_its_absolute_path_imported_from_the_current_directory(
        service, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    body = _submitted(service, capsys, ["jobs/train.py:main", "--init-batch-size", "16", "--max-batch-size", "64",
                                        "--epochs", "2", "--replicas", "2", "--max-replicas", "4", "--weight", "3"])
    assert body == {"entry": f"{tmp_path}/jobs/train.py:main", "import_dir": str(tmp_path),
                    "spec": {"epochs": 2, "init_batch_size": 16, "max_batch_size": 64},
                    "replicas": 2, "batch_size": 16, "max_replicas": 4, "weight": 3.0}


def test_submit_of_a_module_entry_imports_it_from_the_absolute_import_directory(
        service, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    body = _submitted(service, capsys, ["mypkg.train:build", "--import", "src", "--batch-size", "48",
                                        "--init-batch-size", "32", "--max-batch-size", "256", "--target", "0.9"])
    assert body["entry"] == "mypkg.train:build"
    assert body["import_dir"] == str(tmp_path / "src")
    assert body["batch_size"] == 48


def test_submit_spec_flags_override_the_spec_file(service, capsys, tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"epochs": 1, "metric": "accuracy", "init_batch_size": 16,
                                     "max_batch_size": 64, "eval_every": 10}))
    body = _submitted(service, capsys, ["synth-regress", "--spec-file", str(spec_file), "--epochs", "3",
                                        "--target", "0.25", "--metric", "loss", "--lower-is-better",
                                        "--progress-target", "500"])
    assert body["spec"] == {"epochs": 3, "metric": "loss", "init_batch_size": 16, "max_batch_size": 64,
                            "eval_every": 10, "target": 0.25, "higher_is_better": False, "progress_target": 500.0}
    assert body["batch_size"] == 16  # the spec's initial batch, not the kind's


@pytest.mark.parametrize("argv, match", [
    (["no-such-kind"], "unknown job kind 'no-such-kind'"),
    (["train.py:main"], "give its batch sizes"),
    (["train.py:"], "ENTRY must be"),
    (["digits-cnn", "--import", "src"], "--import applies to an entry"),
])
def test_submit_refuses_a_bad_entry_without_asking_the_server(service, capsys, argv, match):
    assert main(["submit", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pollux-opt: error: ") and match in err and "Traceback" not in err
    assert service.requests == []


@pytest.mark.parametrize("content", ["[1, 2]", "{not json"])
def test_submit_refuses_a_spec_file_that_is_not_a_json_object(service, capsys, tmp_path, content):
    (tmp_path / "spec.json").write_text(content)
    assert main(["submit", "digits-cnn", "--spec-file", str(tmp_path / "spec.json")]) == 2
    assert "--spec-file" in capsys.readouterr().err
    assert service.requests == []


def test_submit_after_a_lost_connection_retries_once_with_the_same_key():
    keys: list[str] = []

    def handler(request):
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            raise httpx.ConnectError("connection reset", request=request)
        return httpx.Response(200, json={"id": "12"})

    with Client("http://service.test", transport=httpx.MockTransport(handler)) as client:
        assert client.submit({"kind": "digits-cnn", "replicas": 1, "batch_size": 32}) == "12"
    assert len(keys) == 2 and keys[0] == keys[1]


# ----------------------------------------------------------------- queries
def test_jobs_table_has_a_row_per_job_under_aligned_columns():
    lines = jobs_table([RUNNING, QUEUED], now=1_100.0)
    assert lines[0].split() == ["ID", "NAME", "STATE", "CPUS", "BATCH", "PROGRESS", "GOODPUT", "SPEEDUP",
                                "RESTARTS", "TIME"]
    assert lines[1].split() == ["3", "mnist", "running", "2", "64", "120.5", "512.5", "2.00x", "1", "1:30"]
    assert lines[2].split() == ["4", "main", "queued", "0", "-", "-", "-", "-", "0", "1:40"]
    ends = {len(line) for line in lines}  # right-aligned last column: every row ends at the same column
    assert len(ends) == 1


def test_jobs_prints_the_table_and_asks_for_the_state_given(service, capsys):
    service.answer("GET", "/api/v1/jobs", 200, [RUNNING])
    assert main(["jobs", "--state", "running"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ID") and out[1].split()[:3] == ["3", "mnist", "running"]
    assert service.requests[0]["query"] == {"state": ["running"]}


def test_jobs_json_prints_the_servers_list(service, capsys):
    service.answer("GET", "/api/v1/jobs", 200, [RUNNING, QUEUED])
    assert main(["jobs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [RUNNING, QUEUED]
    assert service.requests[0]["query"] == {}


def test_job_prints_its_fields_and_transitions(service, capsys):
    service.answer("GET", "/api/v1/jobs/3", 200, RUNNING)
    assert main(["job", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = dict(line.split(":", 1) for line in lines if not line.startswith(" ") and ":" in line)
    assert fields["id"].strip() == "3" and fields["state"].strip() == "running"
    assert fields["placement"].strip() == '{"n0": 2}'
    assert fields["eta_s"].strip() == "1:35"
    assert fields["transitions"].strip() == "2"
    assert "-> queued  (submit)" in lines[-2]
    assert "queued -> running  (placed)" in lines[-1]


def test_job_json_prints_the_servers_job(service, capsys):
    service.answer("GET", "/api/v1/jobs/3", 200, RUNNING)
    assert main(["job", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == RUNNING


def test_a_job_id_is_quoted_whole_so_it_never_names_another_path(service, capsys):
    assert main(["job", "../cluster"]) == 2
    assert service.requests[0]["path"] == "/api/v1/jobs/..%2Fcluster"
    assert "404" in capsys.readouterr().err


@pytest.mark.parametrize("follow", [False, True])
def test_logs_prints_the_rank_log_and_follows_it_on_request(service, capsys, follow):
    service.answer("GET", "/api/v1/jobs/3/logs", 200, ("gen0 step 1\n", "gen0 step 2\n"))
    assert main(["logs", "3", "--rank", "1", *(["-f"] if follow else [])]) == 0
    assert capsys.readouterr().out == "gen0 step 1\ngen0 step 2\n"
    query = service.requests[0]["query"]
    assert query["rank"] == ["1"] and query["follow"] == ["true" if follow else "false"]


def test_cancel_asks_the_server_and_says_so(service, capsys):
    service.answer("POST", "/api/v1/jobs/3/cancel", 202, {"id": "3", "request": 5})
    assert main(["cancel", "3"]) == 0
    assert capsys.readouterr().out == "job 3: cancel requested\n"
    assert service.requests[0]["method"] == "POST"


def test_set_sends_the_new_weight(service, capsys):
    service.answer("PATCH", "/api/v1/jobs/3", 200, {"id": "3", "request": 6})
    assert main(["set", "3", "--weight", "2.5"]) == 0
    assert capsys.readouterr().out == "job 3: weight 2.5 requested\n"
    assert service.requests[0]["body"] == {"weight": 2.5}


# ----------------------------------------------------------------- errors, server and token
def test_an_http_error_is_one_line_with_the_status_and_the_servers_message(service, capsys):
    service.answer("POST", "/api/v1/jobs/3/cancel", 409, {"error": "job '3' is already succeeded"})
    assert main(["cancel", "3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "pollux-opt: error: the server answered 409 Conflict: job '3' is already succeeded"]


def test_logs_of_an_unknown_job_is_one_line_with_the_servers_message(service, capsys):
    service.answer("GET", "/api/v1/jobs/9/logs", 404, {"error": "no job '9'"})
    assert main(["logs", "9", "-f"]) == 2
    assert capsys.readouterr().err.splitlines() == ["pollux-opt: error: the server answered 404 Not Found: no job '9'"]


def test_an_unreachable_server_is_one_line_naming_its_url_and_how_to_start_one(monkeypatch, capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("POLLUX_OPT_SERVER", url)
    assert main(["jobs"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert url in err and "pollux-opt serve --state DIR" in err and "--server" in err


def test_server_flag_beats_the_environment_which_beats_the_default(service, capsys, monkeypatch):
    dead = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("POLLUX_OPT_SERVER", dead)
    service.answer("GET", "/api/v1/jobs", 200, [])
    assert main(["jobs", "--server", service.url]) == 0
    assert len(service.requests) == 1
    assert server_url(None) == dead and server_url("http://h:1/") == "http://h:1"
    monkeypatch.delenv("POLLUX_OPT_SERVER")
    assert server_url(None) == DEFAULT_SERVER


def test_a_server_url_without_http_is_refused_naming_it(capsys):
    assert main(["jobs", "--server", "localhost:8470"]) == 2
    assert "--server must be an http:// or https:// URL" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["file", "env", "none"])
def test_the_token_from_the_file_or_the_environment_is_sent_as_bearer(service, capsys, tmp_path, monkeypatch,
                                                                       source):
    argv = ["jobs"]
    if source == "file":
        (tmp_path / "token").write_text("s3cret-file\n")
        monkeypatch.setenv("POLLUX_OPT_TOKEN", "loses-to-the-file")
        argv += ["--token-file", str(tmp_path / "token")]
    elif source == "env":
        monkeypatch.setenv("POLLUX_OPT_TOKEN", "s3cret-env")
    service.answer("GET", "/api/v1/jobs", 200, [])
    assert main(argv) == 0
    headers = {k.lower(): v for k, v in service.requests[0]["headers"].items()}
    expected = {"file": "Bearer s3cret-file", "env": "Bearer s3cret-env", "none": None}[source]
    assert headers.get("authorization") == expected


def test_an_unreadable_token_file_is_refused_naming_it(service, capsys, tmp_path):
    assert main(["jobs", "--token-file", str(tmp_path / "missing")]) == 2
    assert "--token-file" in capsys.readouterr().err and service.requests == []


# ----------------------------------------------------------------- serve
@pytest.fixture
def fake_serve(monkeypatch):
    """``pollux_opt.service.server`` replaced by one whose ``serve`` records its arguments."""
    calls: list[tuple] = []
    module = types.ModuleType("pollux_opt.service.server")
    module.serve = lambda state_dir, **kwargs: calls.append((state_dir, kwargs))
    monkeypatch.setitem(sys.modules, "pollux_opt.service.server", module)
    return calls


def test_serve_passes_its_options_and_the_cluster_of_nodes_and_cpus(fake_serve, tmp_path):
    assert main(["serve", "--state", str(tmp_path / "s"), "--nodes", "2", "--cpus", "2", "--interval", "5",
                 "--port", "9000", "--cancel-grace", "3"]) == 0
    ((state, kwargs),) = fake_serve
    assert state == str(tmp_path / "s")
    assert [n.cpus for n in kwargs.pop("cluster").nodes] == [1, 1]
    assert kwargs == {"backend": "local", "ray_address": None, "policy": None, "interval": 5.0,
                      "host": "127.0.0.1", "port": 9000, "token_file": None, "checkpoint_dir": None,
                      "progress": False, "cancel_grace_s": 3.0, "autoscale": None, "node_cpus": None}


def test_serve_autoscales_only_on_ray(fake_serve, tmp_path, capsys):
    assert main(["serve", "--state", str(tmp_path / "s"), "--autoscale", "1:3"]) == 2
    assert "--autoscale need --backend ray" in capsys.readouterr().err
    assert main(["serve", "--state", str(tmp_path / "s"), "--backend", "ray", "--autoscale", "1:3",
                 "--node-cpus", "2", "--node-startup", "30", "--release-after", "300"]) == 0
    ((_, kwargs),) = fake_serve
    scale = kwargs["autoscale"]
    assert (scale.min_nodes, scale.max_nodes, scale.startup_s, scale.hold_s) == (1, 3, 30.0, 300.0)
    assert kwargs["node_cpus"] == 2


@pytest.mark.parametrize("flags, rule", [
    ([], (DEFAULT_TIME_VALUE, None, None)),
    (["--time-value", "40"], (40.0, None, None)),
    (["--time-value", "none"], (None, THRESHOLD_GROW, THRESHOLD_GROW / 2)),
    (["--grow-above", "0.3"], (None, 0.3, 0.15)),  # a threshold picks the threshold rule
    (["--time-value", "None", "--shrink-below", "0.1"], (None, THRESHOLD_GROW, 0.1)),
])
def test_autoscale_flags_pick_the_cost_or_the_threshold_rule(fake_serve, tmp_path, flags, rule):
    assert main(["serve", "--state", str(tmp_path / "s"), "--backend", "ray", "--autoscale", "1:3", *flags]) == 0
    ((_, kwargs),) = fake_serve
    scale = kwargs["autoscale"]
    assert (scale.time_value, scale.grow_above, scale.shrink_below) == rule


def test_serve_passes_the_server_its_own_arguments(tmp_path):
    """The options the command passes are parameters of the real ``serve``."""
    import inspect

    serve = pytest.importorskip("pollux_opt.service.server").serve
    calls = []
    fake = types.ModuleType("pollux_opt.service.server")
    fake.serve = lambda state_dir, **kwargs: calls.append(kwargs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "pollux_opt.service.server", fake)
        assert main(["serve", "--state", str(tmp_path / "s"), "--cancel-grace", "3"]) == 0
    assert set(calls[0]) <= set(inspect.signature(serve).parameters)
    assert calls[0]["progress"] is False  # a service logs; its live table is asked for with --progress


@pytest.mark.parametrize("argv, match", [
    (["--backend", "ray", "--nodes", "2"], "do not apply with --backend ray"),
    (["--checkpoint-dir", "/shared"], "need --backend ray"),
])
def test_serve_refuses_cluster_flags_that_do_not_apply_to_its_backend(fake_serve, tmp_path, capsys, argv, match):
    assert main(["serve", "--state", str(tmp_path / "s"), *argv]) == 2
    assert match in capsys.readouterr().err
    assert fake_serve == []


def test_serve_without_the_service_extra_names_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # an import of it fails, as where it is not installed
    assert main(["serve", "--state", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'pollux-opt[service]'" in err and "Traceback" not in err
