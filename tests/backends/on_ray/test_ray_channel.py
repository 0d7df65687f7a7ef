"""The supervisor's connection to a replica actor (pollux_opt/backends/ray/channel.py)
without a Ray cluster: a relay over an in-process stand-in of the actor's
methods carries messages in order both ways, delivers an error report before
its sender goes on, and gives EOF on either side as a pipe does."""

from __future__ import annotations

import threading
from multiprocessing.connection import wait
from types import SimpleNamespace

import pytest

from pollux_opt.backends.ray.channel import Relay, WorkerChannel

#: Upper bound on waits for something the relay's threads do (never reached when it works).
WAIT_S = 10.0


class FakeActorDied(Exception):
    pass


class FakeActor:
    """A replica actor's channel methods, called in this process; ``die()`` is ``ray.kill``."""

    def __init__(self) -> None:
        self.channel = WorkerChannel()
        self.dead = threading.Event()
        self.command = self._method(self.channel.put)
        self.outbox = self._method(self.channel.take)
        self.hang_up = self._method(self.channel.hang_up)

    def _method(self, fn):
        def call(*args):
            if self.dead.is_set():
                raise FakeActorDied
            out = fn(*args)
            if self.dead.is_set():
                raise FakeActorDied
            return out

        return SimpleNamespace(remote=lambda *args: (lambda: call(*args)))

    def die(self) -> None:
        self.dead.set()


#: ``ray.get`` of a stand-in ref runs the call; ``ray.exceptions`` as Ray's.
FAKE_RAY = SimpleNamespace(get=lambda ref, timeout=None: ref(),
                           exceptions=SimpleNamespace(RayError=FakeActorDied))


@pytest.fixture
def relay():
    actor = FakeActor()
    relay = Relay(FAKE_RAY, actor, name="test-relay")
    yield relay, actor
    actor.die()
    relay.stop()
    assert relay.join(WAIT_S), "a relay thread did not end"


def test_messages_arrive_in_order_both_ways_through_a_waitable_connection(relay):
    relay, actor = relay
    for i in range(200):
        relay.conn.send(("prepare", i))
    assert [actor.channel.recv() for _ in range(200)] == [("prepare", i) for i in range(200)]
    for i in range(200):
        actor.channel.send(("metrics", {"step": i}))
    got = []
    while len(got) < 200:
        assert wait([relay.conn], timeout=WAIT_S) == [relay.conn]
        got.append(relay.conn.recv())
    assert got == [("metrics", {"step": i}) for i in range(200)]


def test_a_message_is_a_copy_taken_when_it_is_sent(relay):
    relay, actor = relay
    info = {"step": 1}
    actor.channel.send(("metrics", info))
    info["step"] = 2
    assert relay.conn.poll(WAIT_S) and relay.conn.recv() == ("metrics", {"step": 1})


def test_an_error_report_is_in_the_supervisors_pipe_before_its_sender_goes_on(relay):
    relay, actor = relay
    actor.channel.send(("error", {"rank": 0, "error": "ValueError: width"}))
    # The worker may leave with os._exit right here: the report must already be delivered.
    assert relay.conn.poll(0) and relay.conn.recv()[0] == "error"


def test_a_killed_actor_is_eof_for_the_supervisor_and_ends_the_relay(relay):
    relay, actor = relay
    actor.channel.send(("hello", {"pid": 1}))
    assert relay.conn.poll(WAIT_S) and relay.conn.recv()[0] == "hello"
    actor.die()
    assert wait([relay.conn], timeout=WAIT_S) == [relay.conn]
    with pytest.raises(EOFError):
        relay.conn.recv()
    assert relay.join(WAIT_S)


def test_a_worker_loop_that_ends_delivers_its_last_reports_then_eof(relay):
    relay, actor = relay
    actor.channel.send(("paused", {"step": 7}))
    assert actor.channel.flush(WAIT_S)
    actor.channel.close()
    assert relay.conn.poll(WAIT_S) and relay.conn.recv() == ("paused", {"step": 7})
    assert relay.conn.poll(WAIT_S)
    with pytest.raises(EOFError):
        relay.conn.recv()


def test_a_supervisor_that_closes_its_connection_hangs_the_worker_up(relay):
    relay, actor = relay
    relay.conn.send(("run", "a"))
    relay.conn.close()
    assert actor.channel.recv() == ("run", "a")  # what was sent before the close still arrives
    assert actor.channel.poll(WAIT_S)
    with pytest.raises(EOFError):
        actor.channel.recv()
    with pytest.raises(BrokenPipeError):
        actor.channel.send(("paused", {}))
    assert relay.join(WAIT_S)
