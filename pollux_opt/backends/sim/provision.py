"""The simulator's node provider: nodes that start after a delay and are billed until released.

A node of the largest cluster is *down* (not billed), *starting* (requested,
billed, up at its ready time), *up* (takes replicas) or *draining* (still
billed and holding jobs, but offered to no policy: its jobs move off in the
next round, and it is released once it holds none).  Each change is a
``scale`` event (fields ``requested``, ``ready``, ``released``: node id ->
type, and ``sizes``, the nodes per type provisioned after it), from which
:func:`pollux_opt.records.metrics.node_usage` bills the run.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from pollux_opt.model import Cluster
from pollux_opt.records.events import EventLog, NullLog

__all__ = ["NodeState", "SimNodes"]


class NodeState(str, enum.Enum):
    """Where a simulated node is in its life."""

    DOWN = "down"
    STARTING = "starting"
    UP = "up"
    DRAINING = "draining"


class SimNodes:
    """The nodes of a simulated cloud cluster (a :class:`~pollux_opt.scheduling.autoscale.Provider`).

    Args:
        largest: every node that may be provisioned.
        initial: nodes per type up from the start (the first of each type in
            ``largest``'s order; see :meth:`announce`).
        startup_s: seconds from a request to the node being up.
        events: the run's event log.
    """

    def __init__(self, largest: Cluster, initial: Mapping[str, int], *, startup_s: float,
                 events: EventLog | None = None) -> None:
        self.largest = largest
        self.startup_s = float(startup_s)
        self.events = NullLog() if events is None else events
        self.state = {n.id: NodeState.DOWN for n in largest.nodes}
        self.ready_at: dict[str, float] = {}
        self._type = {n.id: n.type for n in largest.nodes}
        #: The ``scale`` events emitted, also kept here (a simulation may keep no event log).
        self.history: list[dict] = []
        for t, count in initial.items():
            for node in largest.of_type(t)[:count]:
                self.state[node.id] = NodeState.UP

    def announce(self, now: float) -> None:
        """Log the nodes up at the start (one ``scale`` event; call it once, after ``run_start``)."""
        up = [nid for nid, s in self.state.items() if s is NodeState.UP]
        self._emit(now, requested=up, ready=up)

    def _emit(self, now: float, *, requested=(), ready=(), released=()) -> None:
        if requested or ready or released:
            named = lambda ids: {nid: self._type[nid] for nid in ids}  # noqa: E731
            fields = dict(requested=named(requested), ready=named(ready), released=named(released),
                          sizes=self.provisioned())
            self.events.emit("scale", now, None, **fields)
            self.history.append({"type": "scale", "t": now, "job_id": None, **fields})

    def current_cluster(self) -> Cluster:
        up = [n for n in self.largest.nodes if self.state[n.id] is NodeState.UP]
        return Cluster(tuple(up))

    def provisioned(self) -> dict[str, int]:
        sizes = {t: 0 for t in self.largest.types}
        for nid, state in self.state.items():
            if state in (NodeState.UP, NodeState.STARTING):
                sizes[self._type[nid]] += 1
        return sizes

    def tick(self, now: float, load: Mapping[str, int]) -> None:
        """Bring up the nodes whose start-up is over and release the drained ones
        (``load``: replicas per node id now)."""
        ready = [nid for nid, s in self.state.items() if s is NodeState.STARTING and self.ready_at[nid] <= now]
        gone = [nid for nid, s in self.state.items() if s is NodeState.DRAINING and not load.get(nid)]
        for nid in ready:
            self.state[nid] = NodeState.UP
        for nid in gone:
            self.state[nid] = NodeState.DOWN
        self._emit(now, ready=ready, released=gone)

    def provision(self, now: float, sizes: Mapping[str, int], load: Mapping[str, int] | None = None) -> None:
        """Request or release nodes so that ``sizes`` per type are up or starting.

        Growing takes back draining nodes first (they are up), then starts
        down ones.  Shrinking cancels starting nodes first (billed until now),
        then drains the up nodes holding the fewest replicas."""
        load = load or {}
        requested, ready, released = [], [], []
        have = self.provisioned()
        for t in self.largest.types:
            ids = [n.id for n in self.largest.of_type(t)]
            change = int(sizes.get(t, have[t])) - have[t]
            for nid in [i for i in ids if self.state[i] is NodeState.DRAINING][:max(change, 0)]:
                self.state[nid] = NodeState.UP
                change -= 1
            for nid in [i for i in ids if self.state[i] is NodeState.DOWN][:max(change, 0)]:
                self.state[nid] = NodeState.STARTING if self.startup_s > 0 else NodeState.UP
                self.ready_at[nid] = now + self.startup_s
                requested.append(nid)
                if self.startup_s <= 0:
                    ready.append(nid)
                change -= 1
            starting = [i for i in reversed(ids) if self.state[i] is NodeState.STARTING]
            for nid in starting[:max(-change, 0)]:
                self.state[nid] = NodeState.DOWN
                released.append(nid)
                change += 1
            up = sorted((i for i in ids if self.state[i] is NodeState.UP),
                        key=lambda i: (load.get(i, 0), -ids.index(i)))
            for nid in up[:max(-change, 0)]:
                self.state[nid] = NodeState.DRAINING
                change += 1
        self._emit(now, requested=requested, ready=ready, released=released)
        self.tick(now, load)
