"""Fixtures of the service's API tests: a real store on a temporary state
directory, its event index (to play the scheduler loop by hand) and
``TestClient``s over :func:`pollux_opt.service.app.make_app`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

#: The test cluster: two nodes of four CPUs.
CLUSTER = [{"id": "n0", "cpus": 4}, {"id": "n1", "cpus": 4}]


class ApiHarness:
    """A state directory with its store and index; :meth:`client` serves the API over them."""

    def __init__(self, state_dir: Path) -> None:
        from pollux_opt.service.db import DB_FILE, EventIndex, Store

        self.state_dir = state_dir
        self.store = Store(state_dir / DB_FILE)
        self.started_unix = time.time()  # event times are seconds after this, as in a run
        self.index = EventIndex(state_dir / DB_FILE, self.started_unix)
        self.notified = 0

    def notify(self) -> None:
        self.notified += 1

    def client(self, **kwargs):
        """A TestClient of the API (``kwargs``: more arguments of ``make_app``, e.g. ``token``)."""
        from fastapi.testclient import TestClient

        from pollux_opt.service.app import make_app

        app = make_app(self.store, state_dir=self.state_dir, notify=self.notify, cluster=CLUSTER, **kwargs)
        return TestClient(app)

    def play(self, *events: dict) -> None:
        """Write ``events`` as the scheduler loop does: appended to the event log, then folded into the index."""
        with open(self.state_dir / "events.jsonl", "a") as log:
            for event in events:
                log.write(json.dumps(event) + "\n")
        for event in events:
            self.index.apply(event)

    def close(self) -> None:
        self.index.close()
        self.store.close()


@pytest.fixture
def api(tmp_path: Path):
    harness = ApiHarness(tmp_path)
    yield harness
    harness.close()
