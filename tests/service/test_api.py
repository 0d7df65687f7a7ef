"""The service's HTTP API over a real store, with the scheduler loop played by
hand: events folded into the index (see ``conftest.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs its extra (pip install 'pollux-opt[service]')")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from pollux_opt.service.app import MAX_BODY_BYTES  # noqa: E402
from pollux_opt.service.db import DB_FILE, OpenSource  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
#: A registered job; its spec's initial batch size is 32.
DIGITS = {"kind": "digits-cnn"}
#: The spec fields a user's script job needs (batch limits and a completion criterion).
SCRIPT_SPEC = {"init_batch_size": 32, "max_batch_size": 256, "target": 0.9, "metric": "accuracy"}


def submit_event(job_id: str, t: float = 1.0) -> dict:
    return {"t": t, "job_id": job_id, "type": "submit", "submitted_replicas": 1, "submitted_batch_size": 32}


def start_event(job_id: str, placement: dict, t: float = 2.0) -> dict:
    return {"t": t, "job_id": job_id, "type": "start", "placement": placement}


def running_event(job_id: str, t: float = 2.5) -> dict:
    """The runtime's move to ``running``: its workers train."""
    return {"t": t, "job_id": job_id, "type": "state", "state": "running", "old": "rescaling",
            "reason": "workers resumed: start", "at": t}


def report_event(job_id: str, t: float = 3.0, **fields) -> dict:
    return {"t": t, "job_id": job_id, "type": "report", **fields}


def end_event(job_id: str, etype: str = "complete", t: float = 4.0) -> dict:
    return {"t": t, "job_id": job_id, "type": etype, "verified": True, "value": 0.95}


def submitted(client, job: dict = DIGITS) -> str:
    answer = client.post("/api/v1/jobs", json=job)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def running(api, client, placement=None) -> str:
    """A submitted job the loop started on ``placement``, its workers training."""
    job_id = submitted(client)
    api.play(submit_event(job_id), start_event(job_id, placement or {"n0": 2}), running_event(job_id))
    return job_id


def error(answer) -> str:
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    return answer.json()["error"]


# ------------------------------------------------------------------ submit
def test_submitting_a_registered_kind_stores_a_workload_job_with_the_kinds_batch_size(api):
    client = api.client()
    answer = client.post("/api/v1/jobs", json={**DIGITS, "replicas": 2, "weight": 3.0, "name": "my digits"})
    assert answer.status_code == 201 and answer.json() == {"id": "1"}
    assert api.notified == 1
    source = OpenSource(api.state_dir / DB_FILE, api.started_unix)
    try:
        (job,) = source.new_jobs()
    finally:
        source.close()
    assert (job.id, job.kind, job.replicas, job.batch_size, job.weight) == ("1", "digits-cnn", 2, 32, 3.0)
    assert client.get("/api/v1/jobs/1").json()["name"] == "my digits"


def test_a_users_script_entry_is_checked_by_importing_it(api, tmp_path):
    script = tmp_path / "user_job_module.py"
    script.write_text("def main():\n    pass\n")
    client = api.client()
    answer = client.post("/api/v1/jobs", json={"entry": f"{script}:main", "spec": SCRIPT_SPEC})
    assert answer.status_code == 201, answer.text
    job = client.get(f"/api/v1/jobs/{answer.json()['id']}").json()
    assert (job["entry"], job["kind"], job["spec"]) == (f"{script}:main", "user_job_module", SCRIPT_SPEC)
    relative = client.post("/api/v1/jobs", json={"entry": "user_job_module.py:main", "import_dir": str(tmp_path),
                                                 "batch_size": 64, "spec": SCRIPT_SPEC})
    assert relative.status_code == 201, relative.text
    missing = client.post("/api/v1/jobs", json={"entry": f"{script}:absent", "spec": SCRIPT_SPEC})
    assert missing.status_code == 400 and "no function 'absent'" in error(missing)


def test_an_entry_may_replace_another_jobs_module_of_its_name_but_not_the_services_own(api, tmp_path):
    first, other = tmp_path / "first", tmp_path / "other"
    for folder in (first, other):
        folder.mkdir()
        (folder / "user_loaded_module.py").write_text("def main():\n    pass\n")
    body = {"entry": f"{first / 'user_loaded_module.py'}:main", "spec": SCRIPT_SPEC}
    client = api.client()
    assert client.post("/api/v1/jobs", json=body).status_code == 201
    assert client.post("/api/v1/jobs", json=body).status_code == 201  # the same file: nothing is replaced
    again = client.post("/api/v1/jobs", json={**body, "entry": f"{other / 'user_loaded_module.py'}:main"})
    assert again.status_code == 201  # another job's module of that name is imported afresh, as in a warm worker
    own = client.post("/api/v1/jobs", json={**body, "entry": "pollux_opt.elastic:run", "import_dir": str(other)})
    assert own.status_code == 400 and "module 'pollux_opt'" in error(own) and "rename the job's module" in error(own)


def test_the_example_digits_script_can_be_submitted(api):
    pytest.importorskip("torch", reason="importing the script needs torch")
    pytest.importorskip("sklearn", reason="importing the script needs scikit-learn")
    entry = f"{REPO / 'examples' / 'user-jobs' / 'digits_cnn.py'}:main"
    answer = api.client().post("/api/v1/jobs", json={"entry": entry, "spec": SCRIPT_SPEC, "max_replicas": 2})
    assert answer.status_code == 201, answer.text


@pytest.mark.parametrize(("body", "words"), [
    ({"kind": "digits-cnn", "entry": "/x.py:main"}, "exactly one of kind"),
    ({"spec": {}}, "exactly one of kind"),
    ({"entry": "relative.py:main", "spec": SCRIPT_SPEC}, "needs import_dir"),
    ({"entry": "relative.py:main", "import_dir": "not/absolute", "spec": SCRIPT_SPEC},
     "import_dir must be an absolute path"),
    ({"kind": "digits-cnn", "import_dir": "/tmp"}, "import_dir applies to an entry"),
    ({"kind": "no-such-kind"}, "no-such-kind"),
    ({"kind": "digits-cnn", "batch_size": 4096}, "batch_size must be at most its max_batch_size (512), got 4096"),
    ({"kind": "digits-cnn", "spec": {"no_such_field": 1}}, "no_such_field"),
    ({"kind": "digits-cnn", "min_replicas": 3, "max_replicas": 2}, "max_replicas must be >= min_replicas"),
    ({"kind": "digits-cnn", "spec": {"config": {"lr": float("nan")}}}, "body.spec.config.lr must be a finite"),
])
def test_a_bad_submission_is_a_400_naming_what_is_wrong(api, body, words):
    answer = api.client().post("/api/v1/jobs", content=json.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert words in error(answer)
    assert api.notified == 0 and api.store.jobs() == []


@pytest.mark.parametrize(("body", "words"), [
    ({"kind": "digits-cnn", "weight": -1}, "body.weight: Input should be greater than or equal to"),
    ({"kind": "digits-cnn", "replicas": "two"}, "body.replicas: Input should be a valid integer"),
    ({"kind": "digits-cnn", "colour": "blue"}, "body.colour: Extra inputs are not permitted, got 'blue'"),
    ({"kind": "digits-cnn", "name": "x" * 101}, "body.name: String should have at most 100 characters"),
    ([1, 2], "body: Input should be a valid dictionary"),
])
def test_a_submission_of_the_wrong_shape_is_a_422_naming_the_field_and_value(api, body, words):
    answer = api.client().post("/api/v1/jobs", json=body)
    assert answer.status_code == 422 and words in error(answer)


def test_a_malformed_json_body_is_refused_with_a_json_error(api):
    answer = api.client().post("/api/v1/jobs", content=b'{"kind": ', headers={"content-type": "application/json"})
    assert answer.status_code in (400, 422) and "not JSON" in error(answer)


def test_a_retried_submission_with_the_same_idempotency_key_gets_the_same_job(api):
    client = api.client()
    first = client.post("/api/v1/jobs", json=DIGITS, headers={"Idempotency-Key": "abc"})
    again = client.post("/api/v1/jobs", json=DIGITS, headers={"Idempotency-Key": "abc"})
    other = client.post("/api/v1/jobs", json=DIGITS, headers={"Idempotency-Key": "def"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert first.json() == again.json() == {"id": "1"} and other.json() == {"id": "2"}
    assert len(api.store.jobs()) == 2 and api.notified == 2


# ------------------------------------------------------------------ read
def test_jobs_are_listed_oldest_first_and_filtered_by_state(api):
    client = api.client()
    first, second, third = (submitted(client) for _ in range(3))
    api.play(submit_event(first), start_event(first, {"n0": 1}), submit_event(second),
             start_event(second, {"n1": 1}), end_event(second))
    assert [j["id"] for j in client.get("/api/v1/jobs").json()] == [first, second, third]
    states = {s: [j["id"] for j in client.get("/api/v1/jobs", params={"state": s}).json()]
              for s in ("queued", "rescaling", "running", "succeeded", "failed")}
    assert states == {"queued": [third], "rescaling": [first], "running": [], "succeeded": [second], "failed": []}
    api.play(running_event(first))  # its workers formed and train
    assert [j["id"] for j in client.get("/api/v1/jobs", params={"state": "running"}).json()] == [first]


def test_the_list_shows_each_job_as_its_own_page_does_in_submission_order(api):
    client = api.client()
    ids = [submitted(client, {**DIGITS, "spec": {"progress_target": 100.0}}) for _ in range(40)]
    events = []
    for k, job_id in enumerate(reversed(ids[::3])):  # the loop takes them newest first
        events += [submit_event(job_id), start_event(job_id, {"n0": 1}), running_event(job_id),
                   report_event(job_id, goodput=8.0 + k, goodput_base=4.0, progress=float(k), batch_size=32)]
    api.play(*events, end_event(ids[3]))
    listed = client.get("/api/v1/jobs").json()
    assert [j["id"] for j in listed] == ids
    pages = [client.get(f"/api/v1/jobs/{job_id}").json() for job_id in ids]
    assert listed == [{k: v for k, v in page.items() if k != "transitions"} for page in pages]
    by_id = {j["id"]: j for j in listed}
    assert by_id[ids[3]]["state"] == "succeeded" and by_id[ids[3]]["eta_s"] is None  # ended: nothing remains
    assert by_id[ids[0]]["eta_s"] == pytest.approx((100.0 - 13.0) * 32 / (8.0 + 13))  # the last one taken
    assert by_id[ids[1]]["eta_s"] is None and by_id[ids[1]]["state"] == "queued"


def test_an_unknown_state_filter_is_a_422_naming_it_and_the_known_states(api):
    answer = api.client().get("/api/v1/jobs", params={"state": "sleeping"})
    assert answer.status_code == 422
    assert "'sleeping'" in error(answer) and "queued, running, rescaling, succeeded, failed, cancelled" in error(answer)


def test_a_job_shows_its_transitions_numbers_and_remaining_seconds(api):
    client = api.client()
    job_id = submitted(client, {**DIGITS, "spec": {"progress_target": 100.0}})
    assert client.get(f"/api/v1/jobs/{job_id}").json()["eta_s"] is None  # no goodput measured yet
    api.play(submit_event(job_id), start_event(job_id, {"n0": 2}), running_event(job_id),
             report_event(job_id, goodput=64.0, goodput_base=32.0, progress=40.0, batch_size=64, step=10))
    job = client.get(f"/api/v1/jobs/{job_id}").json()
    assert (job["state"], job["replicas"], job["batch_size"], job["speedup"]) == ("running", 2, 64, 2.0)
    assert [(m["old"], m["new"], m["reason"]) for m in job["transitions"]] == [
        (None, "queued", "submit"), ("queued", "rescaling", "start"), ("rescaling", "running", "workers resumed: start")]
    assert job["eta_s"] == pytest.approx((100.0 - 40.0) * 32 / 64.0)


def test_an_unknown_job_is_a_404(api):
    client = api.client()
    for answer in (client.get("/api/v1/jobs/7"), client.post("/api/v1/jobs/7/cancel"),
                   client.patch("/api/v1/jobs/7", json={"weight": 2.0}), client.get("/api/v1/jobs/7/logs")):
        assert answer.status_code == 404 and error(answer) == "no job '7'"


# ------------------------------------------------------------------ requests
def test_cancel_is_accepted_until_the_job_ended_then_a_409_names_its_state(api):
    client = api.client()
    job_id = running(api, client)
    answer = client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 202 and answer.json() == {"id": job_id, "request": 1}
    assert api.notified == 2  # the submission, then the request
    api.play(end_event(job_id, "cancelled"))
    late = client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert late.status_code == 409 and error(late) == f"job '{job_id}' is cancelled: an ended job never changes"


def test_a_new_weight_is_a_request_and_refused_out_of_range_or_once_ended(api):
    client = api.client()
    job_id = running(api, client)
    answer = client.patch(f"/api/v1/jobs/{job_id}", json={"weight": 4.0})
    assert answer.status_code == 200 and answer.json() == {"id": job_id, "request": 1, "weight": 4.0}
    for bad in (0, -1, 1e7):
        refused = client.patch(f"/api/v1/jobs/{job_id}", json={"weight": bad})
        assert refused.status_code == 422 and "body.weight" in error(refused) and f"got {bad}" in error(refused)
    api.play(end_event(job_id))
    late = client.patch(f"/api/v1/jobs/{job_id}", json={"weight": 2.0})
    assert late.status_code == 409 and "is succeeded" in error(late)


# ------------------------------------------------------------------ logs
def write_log(api, job_id: str, name: str, text: str) -> Path:
    path = api.state_dir / "jobs" / job_id / "logs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text)
    return path


def test_a_log_is_read_from_a_byte_offset_with_the_next_offset_in_a_header(api):
    client = api.client()
    job_id = running(api, client)
    assert client.get(f"/api/v1/jobs/{job_id}/logs").text == ""  # no file yet
    write_log(api, job_id, "worker-rank1.log", "gen0 step 1\ngen0 step 2\n")
    write_log(api, job_id, "verify.log", "verified\n")
    whole = client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 1})
    assert whole.text == "gen0 step 1\ngen0 step 2\n" and whole.headers["X-Log-Offset"] == "24"
    rest = client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 1, "offset": 12})
    assert rest.text == "gen0 step 2\n" and rest.headers["X-Log-Offset"] == "24"
    assert client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": "verify"}).text == "verified\n"
    past = client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 1, "offset": 2**62})  # beyond what seek() takes
    assert past.status_code == 200 and past.text == "" and past.headers["X-Log-Offset"] == str(2**62)
    for rank in ("../../events", "-1", "1.5"):
        bad = client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": rank})
        assert bad.status_code == 422 and "query.rank" in error(bad)


def test_following_a_log_streams_what_is_appended_and_ends_once_the_job_ended(api):
    client = api.client()
    job_id = running(api, client)
    write_log(api, job_id, "worker-rank0.log", "first\n")
    with client.stream("GET", f"/api/v1/jobs/{job_id}/logs", params={"follow": "true"}) as answer:
        pieces = answer.iter_bytes()
        got = next(pieces)
        write_log(api, job_id, "worker-rank0.log", "last\n")
        api.play(end_event(job_id))
        got += b"".join(pieces)  # ends by itself: the job ended and the file is read to its end
    assert got == b"first\nlast\n"


# ------------------------------------------------------------------ cluster, events
def test_the_cluster_shows_its_cpus_their_holders_and_the_last_round(api):
    client = api.client()
    job_id = running(api, client, {"n0": 2, "n1": 1})
    api.play({"t": 2.5, "type": "allocation", "objective": 1.25, "solver_s": 0.02, "status": "optimal",
              "placement": {job_id: {"n0": 2, "n1": 1}}})
    view = client.get("/api/v1/cluster").json()
    assert view["nodes"] == [{"id": "n0", "cpus": 4, "type": None}, {"id": "n1", "cpus": 4, "type": None}]
    assert (view["total_cpus"], view["allocated_cpus"], view["free_cpus"]) == (8, 3, 5)
    assert view["holders"] == {job_id: {"n0": 2, "n1": 1}}
    assert view["last_round"] == {"t": pytest.approx(api.started_unix + 2.5), "objective": 1.25, "solver_s": 0.02,
                                  "status": "optimal"}


def sse_events(answer, count: int) -> list[tuple[int, dict]]:
    """The first ``count`` events of a server-sent event stream, as (id, data)."""
    out, event_id = [], None
    for line in answer.iter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            out.append((event_id, json.loads(line[6:])))
            if len(out) == count:
                return out
    raise AssertionError(f"the stream ended after {out}")


def test_the_event_stream_sends_job_events_with_byte_offsets_to_resume_from(api):
    client = api.client()
    api.play(submit_event("1"), report_event("1"), start_event("1", {"n0": 1}), end_event("1"))
    with client.stream("GET", "/api/v1/events", params={"offset": 0}) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        (first_id, first), (second_id, second) = sse_events(answer, 2)
    assert (first["type"], second["type"]) == ("submit", "start")  # the report is not a streamed event
    log = (api.state_dir / "events.jsonl").read_bytes()
    assert log[:second_id].count(b"\n") == 3 and log[second_id - 1:second_id] == b"\n"
    with client.stream("GET", "/api/v1/events", headers={"Last-Event-ID": str(second_id)}) as answer:
        ((_, after),) = sse_events(answer, 1)
    assert after["type"] == "complete"


def test_the_event_stream_starts_at_the_end_of_the_log_by_default(api):
    client = api.client()
    api.play(submit_event("1"))
    with client.stream("GET", "/api/v1/events") as answer:
        assert answer.status_code == 200
        api.play(start_event("1", {"n0": 1}))
        ((_, event),) = sse_events(answer, 1)
    assert event["type"] == "start"
    bad = client.get("/api/v1/events", headers={"Last-Event-ID": "x"})
    assert bad.status_code == 422 and "Last-Event-ID" in error(bad)


# ------------------------------------------------------------------ health, metrics
def test_healthz_answers_ok(api):
    answer = api.client().get("/healthz")
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}


def scrape(client) -> dict[tuple[str, tuple], float]:
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def test_metrics_follow_the_store_and_a_jobs_series_end_with_it(api):
    client = api.client()
    job_id = running(api, client, {"n0": 3})
    submitted(client)
    api.play(report_event(job_id, goodput=96.0, goodput_base=32.0, batch_size=64),
             {"t": 2.5, "type": "allocation", "objective": 0.5, "solver_s": 0.003, "status": "optimal",
              "placement": {job_id: {"n0": 3}}})
    live = scrape(client)
    job = (("job", job_id),)
    assert live[("pollux_jobs", (("state", "running"),))] == 1 and live[("pollux_jobs", (("state", "queued"),))] == 1
    assert live[("pollux_job_submissions_total", ())] == 2
    assert (live[("pollux_job_replicas", job)], live[("pollux_job_batch_size", job)]) == (3, 64)
    assert (live[("pollux_job_goodput_samples_per_second", job)], live[("pollux_job_speedup", job)]) == (96, 3)
    assert live[("pollux_cluster_cpus", (("state", "allocated"),))] == 3
    assert live[("pollux_cluster_cpus", (("state", "free"),))] == 5
    assert live[("pollux_round_decision_seconds_bucket", (("le", "0.005"),))] == 1
    assert live[("pollux_round_decision_seconds_bucket", (("le", "0.001"),))] == 0
    assert live[("pollux_round_objective", ())] == 0.5
    api.play(end_event(job_id, t=5.0))
    ended = scrape(client)
    assert not [key for key in ended if dict(key[1]).get("job") == job_id]
    assert ended[("pollux_job_completions_total", (("outcome", "succeeded"),))] == 1
    assert ended[("pollux_job_completion_seconds_count", ())] == 1
    assert ended[("pollux_job_completion_seconds_bucket", (("le", "10.0"),))] == 1  # about 5 s after submission
    assert ended[("pollux_cluster_cpus", (("state", "free"),))] == 8


# ------------------------------------------------------------------ guard rails
def test_a_token_is_needed_everywhere_but_healthz_and_the_dashboards_files(api):
    client = api.client(token="s3cret")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        for method, path in (("GET", "/api/v1/jobs"), ("POST", "/api/v1/jobs"), ("GET", "/metrics"),
                             ("GET", "/api/v1/charts/jobs"), ("GET", "/no/such/route")):
            answer = client.request(method, path, headers=headers)
            assert answer.status_code == 401 and "bearer token" in error(answer)
    assert client.get("/healthz").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"] and "<table" in page.text
    assert client.get("/static/dashboard.js").status_code == 200  # the page's files hold no data
    good = {"Authorization": "Bearer s3cret"}
    assert client.get("/api/v1/jobs", headers=good).status_code == 200
    assert client.post("/api/v1/jobs", json=DIGITS, headers=good).status_code == 201


def test_charts_are_svg_drawn_from_the_index_and_an_unknown_one_is_a_404(api):
    client = api.client()
    job_id = running(api, client)
    api.play({"t": 2.0, "type": "allocation", "placement": {job_id: {"n0": 2}}, "objective": 1.0, "solver_s": 0.02},
             report_event(job_id, goodput=64.0, batch_size=64))
    for name in ("allocations", "goodput", "utilisation", "jobs", "decisions", "batch"):
        answer = client.get(f"/api/v1/charts/{name}", params={"tz": -18000})
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("image/svg+xml")
        assert 'class="series"' in answer.text, name
    mine = client.get("/api/v1/charts/batch", params={"job": job_id})
    assert mine.status_code == 200 and f"job {job_id}" in mine.text
    assert f"job {job_id}" in client.get("/api/v1/charts/goodput", params={"job": job_id}).text
    assert client.get("/api/v1/charts/batch", params={"job": "99"}).status_code == 404
    assert "query.job" in error(client.get("/api/v1/charts/decisions", params={"job": job_id}))
    assert "give query.job" in error(client.get("/api/v1/charts/efficiency"))  # what one job's model says
    unknown = client.get("/api/v1/charts/cpu-temperature")
    assert unknown.status_code == 404 and "'cpu-temperature'" in error(unknown) and "allocations" in error(unknown)
    assert client.get("/api/v1/charts/jobs", params={"tz": 10**6}).status_code == 422


def test_a_body_over_the_limit_is_a_413_whether_its_length_is_declared_or_not(api):
    client = api.client()
    big = json.dumps({**DIGITS, "name": "x" * MAX_BODY_BYTES}).encode()
    declared = client.post("/api/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and str(MAX_BODY_BYTES) in error(declared)

    def chunks():  # no Content-Length: sent chunked
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    streamed = client.post("/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and str(MAX_BODY_BYTES) in error(streamed)
    small = api.client(max_body_bytes=10).post("/api/v1/jobs", json=DIGITS)
    assert small.status_code == 413
    assert api.store.jobs() == []


def test_unknown_routes_and_wrong_methods_answer_json(api):
    client = api.client()
    missing = client.get("/api/v1/nothing")
    assert missing.status_code == 404 and "/api/v1/nothing" in error(missing)
    wrong = client.delete("/api/v1/jobs")
    assert wrong.status_code == 405 and "DELETE" in error(wrong)
    slash = client.get("/api/v1/jobs/", follow_redirects=False)  # no redirect: an answer of the API's own
    assert slash.status_code == 404 and "/api/v1/jobs/" in error(slash)
