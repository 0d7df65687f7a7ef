"""Random requests against the API: bodies of any JSON (and not JSON), odd
paths and ids, every method.  Each answer is a 2xx or a 4xx with a JSON
``error``, never a 5xx, and the service still answers afterwards."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi", reason="the service needs its extra (pip install 'pollux-opt[service]')")
pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: Cases tried (at least 300), in a fixed order (derandomized) so that a failure reproduces.
EXAMPLES = 400
METHODS = ("GET", "POST", "PATCH", "PUT", "DELETE", "OPTIONS", "HEAD")
#: Known job ids ("1" is submitted before the fuzz) and ids that try to leave the job's directory or break a parser.
ODD_IDS = ("1", "2", "0", "-1", "../x", "..%2F..%2Fetc", "%2e%2e", "%00", "a%00b", "%ff", "%ED%A0%80", "x" * 5000,
           "1;DROP TABLE jobs", " 1", "1/", "%2F")
ROUTES = ("/api/v1/jobs", "/api/v1/jobs/{id}", "/api/v1/jobs/{id}/cancel", "/api/v1/jobs/{id}/logs",
          "/api/v1/cluster", "/api/v1/events", "/metrics", "/healthz", "/api/v1/openapi.json", "/{id}", "/api/v1/{id}",
          "/", "/static/{id}", "/static/dashboard.js", "/api/v1/charts/{id}", "/api/v1/charts/jobs")
NUMBERS = st.one_of(st.integers(), st.integers(min_value=10**15, max_value=10**400), st.floats(),
                    st.sampled_from([0, -1, 1e-7, 1e6, 1e7, 2**63]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=30),
                    st.sampled_from(["NaN", "nan", "Infinity", "-inf", "1e999", "", "\u202e", "\x00",
                                     "\ud800 lone surrogate"]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
FIELDS = ("kind", "entry", "import_dir", "spec", "replicas", "batch_size", "min_replicas", "max_replicas", "weight",
          "name", "id", "arrival_s", "quick_spec", "builder")
SPEC_FIELDS = ("target", "epochs", "progress_target", "init_batch_size", "max_batch_size", "metric", "config",
               "builder", "import_dir", "lr_scaling", "seed")
SPECS = st.one_of(
    st.dictionaries(st.sampled_from(SPEC_FIELDS), st.one_of(st.integers(-2, 10**4), st.floats(), JSON_VALUES),
                    max_size=3),
    st.fixed_dictionaries({"config": st.dictionaries(st.text(max_size=5), SCALARS, max_size=3)}),  # a valid spec
)
#: Bodies of the right shape (mostly), whose content the job checks refuse or accept.
PLAUSIBLE_JOBS = st.fixed_dictionaries({"kind": st.sampled_from(["digits-cnn", "synth-regress", "nope", "a b"])},
                                       optional={
    **{k: st.integers(-1, 6) for k in ("replicas", "min_replicas", "max_replicas")},
    "batch_size": st.integers(-1, 10**4), "weight": st.floats(), "name": st.text(max_size=110), "spec": SPECS})
PLAUSIBLE_ENTRIES = st.fixed_dictionaries({
    "entry": st.one_of(st.sampled_from(["x.py:main", "/nope/x.py:main", "pkg.mod:fn", ":", "a:b:c", "a.py:1x",
                                        "/dev/null:main", "os:system", "hypothesis:given"]), st.text(max_size=20)),
    "spec": SPECS}, optional={
    "import_dir": st.one_of(st.sampled_from(["/nonexistent-dir", "relative", "/\x00"]), st.text(max_size=10))})
#: Bodies known to trip parsers and serializers: not JSON, deep nesting, non-finite numbers
#: (Python's JSON reader takes NaN), lone surrogates (valid JSON escapes, not UTF-8) inside otherwise valid jobs.
NASTY = (b"{", b"[" * 5000, b"{" * 20000, b"\xff\xfe", b"null", b'{"weight": NaN}', b'{"kind": "\\ud800"}',
         b'{"kind": "digits-cnn", "spec": {"config": {"x": Infinity}}}',
         b'{"kind": "digits-cnn", "spec": {"config": {"x": "\\ud800"}}}',
         b'{"kind": "digits-cnn", "spec": {"config": {"\\udfff": 1}}}',
         b'{"kind": "digits-cnn", "spec": {"metric": "\\ud800"}}',
         b'{"kind": "digits-cnn", "batch_size": 1e400}',
         b'{"kind": "digits-cnn", "batch_size": 100000000000000000000000}')
#: Bodies with any JSON in any field.
WILD_JOBS = st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=5)
BODIES = st.one_of(
    st.none(),
    st.one_of(PLAUSIBLE_JOBS, PLAUSIBLE_JOBS, PLAUSIBLE_ENTRIES).map(lambda b: json.dumps(b).encode()),
    st.fixed_dictionaries({"weight": JSON_VALUES}).map(lambda b: json.dumps(b).encode()),
    WILD_JOBS.map(lambda b: json.dumps(b).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.sampled_from(NASTY),
    st.binary(max_size=200),
)
QUERIES = st.dictionaries(st.sampled_from(["state", "rank", "offset", "follow", "x"]),
                          st.one_of(st.text(max_size=12), st.integers().map(str),
                                    st.sampled_from(["verify", "../1", "true", "queued", "-1", str(2**62),
                                                     str(2**70)])),
                          max_size=3)
HEADERS = st.dictionaries(st.sampled_from(["Idempotency-Key", "Last-Event-ID", "Content-Type"]),
                          st.one_of(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
                                    st.sampled_from(["application/json", "text/plain", "x" * 300, "-1"])),
                          max_size=2)


IDS = st.one_of(st.sampled_from(ODD_IDS), st.text(min_size=1, max_size=20))


def path_of(route: str, job_id: str) -> str:
    """The route with the id put in as given (already %-escaped ids stay so) or quoted (any other text)."""
    return route.replace("{id}", job_id if job_id in ODD_IDS else quote(job_id, safe=""))


def routed(methods, routes, bodies=st.none()):
    """Requests ``(method, path, body)`` of one of ``methods`` on one of ``routes`` (any id in them)."""
    return st.tuples(st.sampled_from(methods), st.builds(path_of, st.sampled_from(routes), IDS), bodies)


#: Most requests aim at the routes that read a body, where most of the checking is.
REQUESTS = st.one_of(
    routed(["POST"], ["/api/v1/jobs"], st.one_of(
        st.one_of(PLAUSIBLE_JOBS, PLAUSIBLE_ENTRIES).map(lambda b: json.dumps(b).encode()), st.sampled_from(NASTY))),
    routed(["POST"], ["/api/v1/jobs"], BODIES),
    routed(["PATCH"], ["/api/v1/jobs/{id}"], BODIES),
    routed(["GET", "POST"], ROUTES),
    routed(METHODS, ROUTES, BODIES),
)


@pytest.fixture
def client(api):
    """A client of an API with job "1" submitted and started, its log and the event log begun."""
    client = api.client()
    assert client.post("/api/v1/jobs", json={"kind": "digits-cnn"}).status_code == 201
    api.play({"t": 1.0, "job_id": "1", "type": "submit"}, {"t": 2.0, "job_id": "1", "type": "start",
                                                         "placement": {"n0": 1}})
    log = api.state_dir / "jobs" / "1" / "logs" / "worker-rank0.log"
    log.parent.mkdir(parents=True)
    log.write_text("gen0 step 1\n")
    return client


def test_random_requests_never_get_a_server_error(api, client):
    answers: dict[int, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(request=REQUESTS, query=QUERIES, headers=HEADERS)
    def one(request, query, headers):
        method, path, body = request
        headers = {"Content-Type": "application/json", **headers}  # JSON unless the case says otherwise
        # A streamed answer (a followed log, the event stream) never ends by itself: look at its head only.
        with client.stream(method, path, params=query, content=body, headers=headers,
                           follow_redirects=False) as answer:
            status = answer.status_code
            answers[status] = answers.get(status, 0) + 1
            assert 200 <= status < 300 or 400 <= status < 500, (request, query, headers)
            if status >= 400 and method != "HEAD":
                answer.read()
                assert answer.headers["content-type"] == "application/json", answer.headers
                assert isinstance(answer.json()["error"], str) and answer.json()["error"]

    one()
    assert client.get("/healthz").json() == {"status": "ok"}
    # Whatever was accepted can be shown.
    listed = client.get("/api/v1/jobs")
    assert listed.status_code == 200 and len(listed.json()) == len(api.store.jobs())
    # The fuzz reached past the validation: some requests succeeded, some were refused for their content.
    assert any(200 <= s < 300 for s in answers) and {201, 400, 404, 405, 422} <= set(answers), answers
