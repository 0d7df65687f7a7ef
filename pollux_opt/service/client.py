"""A client of the service's HTTP API (``/api/v1``), as ``pollux-opt submit``,
``jobs``, ``job``, ``logs``, ``cancel`` and ``set`` use it.

Every failure is an :class:`~solvers.InvalidProblem` the command line prints
as one line (exit status 2): :class:`ServiceUnreachable` when nothing answers
at the server's URL, :class:`ServiceError` when the server answers with an
HTTP error (its status and the server's ``error`` message).

httpx is the ``service`` extra's; it is imported when a :class:`Client` is made.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

from solvers import InvalidProblem

from pollux_opt.extras import SERVICE_MISSING, require

__all__ = [
    "DEFAULT_HOST", "DEFAULT_PORT", "DEFAULT_SERVER", "Client", "ServiceError", "ServiceUnreachable", "read_token",
    "server_url", "token_in_file",
]

#: Where ``pollux-opt serve`` listens unless told otherwise (loopback: no token needed).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
DEFAULT_SERVER = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
#: Environment variables of the server's URL and of the bearer token.
SERVER_ENV = "POLLUX_OPT_SERVER"
TOKEN_ENV = "POLLUX_OPT_TOKEN"
#: Seconds a request waits for the server by default (each of connect, read, write).
DEFAULT_TIMEOUT_S = 10.0
#: Characters of a non-JSON error body quoted in an error message (a proxy's HTML page is long).
ERROR_TEXT_CHARS = 200
#: The API's path prefix.
API = "/api/v1"


class ServiceUnreachable(InvalidProblem):
    """Nothing answers at the server's URL (refused, unresolvable or too slow)."""


class ServiceError(InvalidProblem):
    """The server answered with an HTTP error; ``status`` is its code."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def server_url(arg: str | None) -> str:
    """The server's base URL: ``arg`` (``--server``), else ``$POLLUX_OPT_SERVER``, else :data:`DEFAULT_SERVER`.

    Raises:
        InvalidProblem: the URL is not ``http://`` or ``https://``.
    """
    where, url = ("--server", arg) if arg else (f"${SERVER_ENV}", os.environ.get(SERVER_ENV) or DEFAULT_SERVER)
    if not url.startswith(("http://", "https://")) or url.rstrip("/") in ("http:/", "https:/"):
        raise InvalidProblem(f"{where} must be an http:// or https:// URL such as {DEFAULT_SERVER}, got {url!r}")
    return url.rstrip("/")


def read_token(token_file: str | None) -> str | None:
    """The bearer token: ``token_file``'s stripped content, else ``$POLLUX_OPT_TOKEN``, else None.

    Raises:
        InvalidProblem: the file cannot be read or is empty.
    """
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    return token_in_file(token_file)


def token_in_file(token_file: str | os.PathLike) -> str:
    """The stripped content of ``token_file`` (``--token-file``).

    Raises:
        InvalidProblem: the file cannot be read or is empty.
    """
    try:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidProblem(f"--token-file {token_file!r} cannot be read: {exc}") from None
    if not token:
        raise InvalidProblem(f"--token-file {token_file!r} is empty")
    return token


class Client:
    """The service's API at ``url`` (a base URL such as :data:`DEFAULT_SERVER`).

    Args:
        url: the server's base URL (see :func:`server_url`).
        token: bearer token sent with every request (None: none).
        timeout: seconds each request waits for the server (following a log waits for ever).
        transport: an ``httpx`` transport instead of the network (tests).
    """

    def __init__(self, url: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: Any = None) -> None:
        httpx = require("httpx", SERVICE_MISSING)
        self.url = url.rstrip("/")
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self._httpx = httpx

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- the API
    def submit(self, job: dict, *, name: str | None = None) -> str:
        """Submit ``job`` (a job entry, see :mod:`pollux_opt.service`); its new id.

        The request carries an ``Idempotency-Key``; after a connection error it
        is sent once more with the same key, so a submission the server committed
        before the answer was lost is not made twice.
        """
        body = dict(job) if name is None else {**job, "name": name}
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        try:
            answer = self._request("POST", f"{API}/jobs", json=body, headers=headers)
        except ServiceUnreachable:
            answer = self._request("POST", f"{API}/jobs", json=body, headers=headers)
        return str(answer["id"])

    def jobs(self, state: str | None = None) -> list[dict]:
        """Every job, oldest first (those in ``state`` only, if given)."""
        return self._request("GET", f"{API}/jobs", params={} if state is None else {"state": state})

    def job(self, job_id: str) -> dict:
        """One job's fields, its ``transitions`` and ``eta_s`` (seconds, or None)."""
        return self._request("GET", _job_path(job_id))

    def cancel(self, job_id: str) -> dict:
        """Ask the scheduler to cancel the job; the answer (``id``, ``request``)."""
        return self._request("POST", f"{_job_path(job_id)}/cancel")

    def set_weight(self, job_id: str, weight: float) -> dict:
        """Ask the scheduler to give the job priority ``weight``; the server's answer."""
        return self._request("PATCH", _job_path(job_id), json={"weight": weight})

    def cluster(self) -> dict:
        """The cluster: nodes, CPUs (total, allocated, free), their holders and the last round."""
        return self._request("GET", f"{API}/cluster")

    def logs(self, job_id: str, *, rank: int = 0, follow: bool = False) -> Iterator[str]:
        """The text of the job's log of worker ``rank``, in pieces; with ``follow``,
        streamed as it grows until the job ends (no read timeout)."""
        params = {"rank": rank, "offset": 0, "follow": "true" if follow else "false"}
        timeout = self._httpx.Timeout(self.timeout, read=None) if follow else self.timeout
        try:
            with self._http.stream("GET", f"{_job_path(job_id)}/logs", params=params, timeout=timeout) as answer:
                if answer.is_error:
                    answer.read()
                    raise self._error(answer)
                yield from answer.iter_text()
        except self._httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    # ------------------------------------------------------------- plumbing
    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            answer = self._http.request(method, path, **kwargs)
        except self._httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        if answer.is_error:
            raise self._error(answer)
        try:
            return answer.json()
        except ValueError:
            raise ServiceError(f"the server at {self.url} answered {method} {path} with no JSON: "
                               f"{answer.text[:ERROR_TEXT_CHARS]!r}", answer.status_code) from None

    def _unreachable(self, exc: Exception) -> ServiceUnreachable:
        what = ("did not answer within the timeout" if isinstance(exc, self._httpx.TimeoutException)
                else f"cannot be reached ({exc or type(exc).__name__})")
        return ServiceUnreachable(
            f"the pollux-opt service at {self.url} {what}; start one with `pollux-opt serve --state DIR`, "
            f"or point to a running one with --server URL or ${SERVER_ENV}")

    def _error(self, answer: Any) -> ServiceError:
        try:
            body = answer.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "error" in body:
            detail = str(body["error"])
        else:
            detail = answer.text.strip()[:ERROR_TEXT_CHARS] or answer.reason_phrase
        hint = (f" (give the server's token with --token-file FILE or ${TOKEN_ENV})"
                if answer.status_code == 401 else "")
        return ServiceError(f"the server answered {answer.status_code} {answer.reason_phrase}: {detail}{hint}",
                            answer.status_code)


def _job_path(job_id: str) -> str:
    """The job's URL path (the id quoted whole: it never names another path)."""
    return f"{API}/jobs/{quote(str(job_id), safe='')}"
