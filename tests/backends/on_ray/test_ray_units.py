"""The Ray backend's parts that need no Ray cluster: its view of Ray's nodes,
following nodes that join and leave (over in-process job stand-ins), where
work directories go, and the gloo interface of a node's address."""

from __future__ import annotations

import sys

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.backends.ray.backend import RayBackend, shared_workdir_root
from pollux_opt.backends.ray.actors import interface_of
from pollux_opt.backends.ray.nodes import RayNodes
from pollux_opt.backends.ray.backend import recorded_checkpoint_dir
from pollux_opt.records.events import EventLog, read_events
from pollux_opt.scheduling.loop import Decision, DecisionStatus
from pollux_opt.workloads import Workload, WorkloadJob


class FakeRay:
    """``ray.nodes()`` of a cluster whose nodes a test sets."""

    def __init__(self, nodes: list[dict]) -> None:
        self.node_list = nodes

    def nodes(self) -> list[dict]:
        return [dict(n) for n in self.node_list]


def _node(hex_id: str, cpus: float, alive: bool = True, ip: str = "10.0.0.1", gpus: float = 0) -> dict:
    resources = {"CPU": cpus} | ({"GPU": gpus} if gpus else {})
    return {"NodeID": hex_id * 4, "Alive": alive, "NodeManagerAddress": ip, "Resources": resources}


class FakePool:
    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.slots: dict[str, int] = {}
        self.closed = False

    def add_node(self, node: str, count: int) -> None:
        self.slots[node] = self.slots.get(node, 0) + count

    def retire_node(self, node: str) -> None:
        self.slots[node] = 0

    def cancel(self, job_key: str) -> None:
        self.cancelled.append(job_key)

    def uncancel(self, job_key: str) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_the_cluster_is_rays_alive_nodes_with_cpus():
    ray = FakeRay([_node("aaaa", 2), _node("bbbb", 0), _node("cccc", 1, alive=False), _node("dddd", 1)])
    nodes = RayNodes(ray)
    cluster = nodes.cluster()
    assert [(n.id, n.cpus) for n in cluster.nodes] == [("ray-aaaaaaaaaaaa", 2), ("ray-dddddddddddd", 1)]
    assert nodes.get("ray-aaaaaaaaaaaa").ray_id == "aaaa" * 4 and nodes.alive("ray-dddddddddddd")
    ray.node_list[3]["Alive"] = False  # left since the last refresh: not alive, though still listed
    assert not nodes.alive("ray-dddddddddddd") and nodes.get("ray-cccccccccccc") is None
    ray.node_list = [_node("bbbb", 0)]
    assert nodes.refresh() is None


def test_nodes_with_gpus_are_a_node_type_whose_slots_are_their_gpus(tmp_path, fake_jobs):
    """A node Ray reports GPUs for offers a slot per GPU (an actor holding one,
    which sees it as its GPU 0); the others a slot per CPU."""
    ray = FakeRay([_node("aaaa", 8, gpus=2), _node("bbbb", 2), _node("cccc", 1, gpus=4)])
    nodes = RayNodes(ray)
    assert [(n.id, n.cpus, n.type) for n in nodes.cluster().nodes] == [
        ("ray-aaaaaaaaaaaa", 2, "gpu"), ("ray-bbbbbbbbbbbb", 2, "cpu"), ("ray-cccccccccccc", 1, "gpu")]
    assert nodes.gpu_types == ("gpu",)
    clock = fake_jobs.clock()
    workload = Workload("two", (WorkloadJob("a", "digits-cnn", 0.0, 2, 32), WorkloadJob("b", "digits-cnn", 0.0, 2, 32)))
    backend, events = _backend(tmp_path, ray, clock, fake_jobs, workload)
    assert backend.pool.slots == {"ray-aaaaaaaaaaaa": 2, "ray-bbbbbbbbbbbb": 2, "ray-cccccccccccc": 1}
    assert len(backend.views()) == 2
    backend.apply(Decision({"a": {"ray-aaaaaaaaaaaa": 2}, "b": {"ray-bbbbbbbbbbbb": 1, "ray-cccccccccccc": 1}},
                           float("nan"), 0.0, DecisionStatus.FIFO))
    backend.close()
    events.close()
    starts = {e["job_id"]: e for e in read_events(tmp_path / "events.jsonl") if e["type"] == "start"}
    assert starts["a"]["gpus"] == [0, 0] and starts["b"]["gpus"] == [None, 0]
    untyped = RayNodes(FakeRay([_node("aaaa", 2)]))
    assert untyped.gpu_types == () and untyped.cluster().nodes[0].type != "gpu"


def _backend(tmp_path, ray, clock, fake_jobs, workload):
    kwargs = fake_jobs.backend_kwargs(clock)
    nodes = RayNodes(ray)
    events = EventLog(tmp_path / "events.jsonl")
    backend = RayBackend(tmp_path, workload, nodes.cluster(), events, nodes=nodes, fixed_batch=False,
                         started_unix=clock.time(), pool=FakePool(), **kwargs)
    return backend, events


def test_a_node_that_joins_is_placed_on_and_the_jobs_of_one_that_leaves_restart_elsewhere(tmp_path, fake_jobs):
    clock = fake_jobs.clock()
    ray = FakeRay([_node("aaaa", 1), _node("bbbb", 1)])
    workload = Workload("two", (WorkloadJob("a", "digits-cnn", 0.0, 1, 32), WorkloadJob("b", "digits-cnn", 0.0, 1, 32)))
    backend, events = _backend(tmp_path, ray, clock, fake_jobs, workload)
    a_node, b_node = "ray-aaaaaaaaaaaa", "ray-bbbbbbbbbbbb"
    assert len(backend.views()) == 2
    backend.apply(Decision({"a": {a_node: 1}, "b": {b_node: 1}}, float("nan"), 0.0, DecisionStatus.FIFO))
    backend.advance(5.0)
    old_handle = backend.jobs["b"].handle
    ray.node_list = [_node("aaaa", 1), _node("cccc", 2)]  # b's node left, a node of 2 CPUs joined
    backend.advance(1.0)
    assert [(n.id, n.cpus) for n in backend.current_cluster().nodes] == [(a_node, 1), ("ray-cccccccccccc", 2)]
    assert backend.jobs["b"].placement == {} and backend.jobs["a"].placement == {a_node: 1}
    assert backend.pool.cancelled == ["b"] and old_handle.closed and backend.jobs["b"].handle is not old_handle
    assert backend.pool.slots == {a_node: 1, b_node: 1, "ray-cccccccccccc": 2}  # one slot actor per CPU
    with pytest.raises(InvalidProblem, match="unknown node 'ray-bbbbbbbbbbbb'"):
        backend.apply(Decision({"b": {b_node: 1}}, float("nan"), 0.0, DecisionStatus.FIFO))
    backend.apply(Decision({"a": {a_node: 1}, "b": {"ray-cccccccccccc": 2}}, float("nan"), 0.0,
                           DecisionStatus.FIFO))
    backend.close()
    events.close()
    log = read_events(tmp_path / "events.jsonl")
    first, change = [e for e in log if e["type"] == "nodes"]
    assert first["joined"] == [a_node, b_node] and first["left"] == []
    assert change["joined"] == ["ray-cccccccccccc"] and change["left"] == [b_node]
    (fault,) = [e for e in log if e["type"] == "restart_after_fault"]
    assert fault["job_id"] == "b" and fault["placement"] == {} and b_node in fault["reason"]
    assert [e["placement"] for e in log if e["type"] == "rescale_begin" and e["job_id"] == "b"] == [
        {"ray-cccccccccccc": 2}]


def test_an_autoscaled_run_asks_ray_for_nodes_and_gives_back_the_emptiest(tmp_path, fake_jobs, monkeypatch):
    sdk = pytest.importorskip("ray.autoscaler.sdk", reason="the Ray backend needs Ray")
    from pollux_opt.scheduling.autoscale import ScaleOptions

    requests = []
    monkeypatch.setattr(sdk, "request_resources", lambda bundles: requests.append(bundles))
    clock = fake_jobs.clock()
    ray = FakeRay([_node("aaaa", 1), _node("bbbb", 1), _node("cccc", 1)])
    workload = Workload("one", (WorkloadJob("j", "digits-cnn", 0.0, 1, 32),))
    kwargs = fake_jobs.backend_kwargs(clock)
    nodes = RayNodes(ray)
    events = EventLog(tmp_path / "events.jsonl")
    backend = RayBackend(tmp_path, workload, nodes.cluster(), events, nodes=nodes, fixed_batch=False,
                         started_unix=clock.time(), pool=FakePool(), autoscale=ScaleOptions(max_nodes=3),
                         node_cpus=1, **kwargs)
    a, b, c = (f"ray-{x * 12}" for x in "abc")
    backend.views()
    backend.apply(Decision({"j": {b: 1}}, float("nan"), 0.0, DecisionStatus.FIFO))
    backend.advance(1.0)
    assert backend.provisioned() == {"default": 3}
    backend.provision(1.0, {"default": 1})  # two nodes back: the empty ones, not b
    assert requests == [[{"CPU": 1}]]
    assert [n.id for n in backend.current_cluster().nodes] == [b] and backend.pool.slots[a] == 0
    backend.provision(2.0, {"default": 2})  # one taken back, with a fresh slot
    assert requests[-1] == [{"CPU": 1}] * 2 and len(backend.current_cluster().nodes) == 2
    backend.provision(3.0, {"default": 1})
    assert [n.id for n in backend.current_cluster().nodes] == [b]
    ray.node_list = [_node("bbbb", 1)]  # Ray's autoscaler removed the idle ones
    backend.advance(1.0)
    assert [n.id for n in backend.current_cluster().nodes] == [b] and backend.jobs["j"].placement == {b: 1}
    backend.close()
    events.close()
    assert requests[-1] == []  # the run's request is withdrawn at its end
    scales = [e["sizes"] for e in read_events(tmp_path / "events.jsonl") if e["type"] == "scale"]
    assert scales == [{"default": 1}, {"default": 2}, {"default": 1}]
    assert c not in {n.id for n in backend.current_cluster().nodes}


def test_work_directories_go_under_the_shared_checkpoint_directory_one_folder_per_run(tmp_path):
    run_a, run_b, shared = tmp_path / "a", tmp_path / "b", tmp_path / "shared"
    assert shared_workdir_root(run_a, None) == run_a
    root = shared_workdir_root(run_a, shared)
    assert root.parent == shared and root == shared_workdir_root(run_a, shared)
    assert root != shared_workdir_root(run_b, shared)


def test_a_resumed_run_keeps_its_checkpoint_directory(tmp_path):
    run = tmp_path / "run"
    assert recorded_checkpoint_dir(run, tmp_path / "ck") == str((tmp_path / "ck").resolve())
    assert recorded_checkpoint_dir(run, None) == str((tmp_path / "ck").resolve())
    with pytest.raises(InvalidProblem, match="keeps its checkpoints in .*ck', not checkpoint_dir=.*other"):
        recorded_checkpoint_dir(run, tmp_path / "other")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads interface addresses with a Linux ioctl")
def test_gloo_binds_to_the_interface_of_the_nodes_address():
    assert interface_of("127.0.0.1").startswith("lo")
    with pytest.raises(ValueError, match=r"ip='203.0.113.77'"):
        interface_of("203.0.113.77")


def test_a_tcp_store_path_forms_the_group_through_the_store_rank_0_hosts():
    from types import SimpleNamespace

    from pollux_opt.runtime.worker import rendezvous_store

    calls = []
    dist = SimpleNamespace(TCPStore=lambda *a, **kw: calls.append(("tcp", a, kw)),
                           FileStore=lambda *a: calls.append(("file", a, {})))
    options = SimpleNamespace(collective_timeout_s=30.0)
    rendezvous_store(dist, SimpleNamespace(store_path="tcp://10.1.2.3:4567", world=2, options=options))
    rendezvous_store(dist, SimpleNamespace(store_path="/runs/j/rendezvous/gen-1", world=2, options=options))
    (kind, args, kwargs), (kind2, args2, _) = calls
    assert kind == "tcp" and args == ("10.1.2.3", 4567, 2) and kwargs["is_master"] is False
    assert kind2 == "file" and args2 == ("/runs/j/rendezvous/gen-1", 2)


def test_a_replicas_commands_reach_the_assignment_of_their_job_and_generation_only(monkeypatch):
    """Ray may run a threaded actor's calls out of order: routed by job and generation
    (an actor serves every job, each job numbering its own generations)."""
    pytest.importorskip("ray", reason="the replica actor reads its node's address with Ray")
    from types import SimpleNamespace

    from pollux_opt.backends.ray import actors
    from pollux_opt.runtime import worker

    def echo_commands(link, *args, **kwargs) -> None:  # an assignment reporting the commands it reads
        while link.poll():
            link.send(link.recv())

    monkeypatch.setattr(worker, "worker_setup", lambda interface: (None, None, None))
    monkeypatch.setattr(actors, "interface_of", lambda ip: "lo")
    monkeypatch.setattr(worker, "serve_assignment", echo_commands)
    actor = actors.ReplicaActor()
    actor.command(("j", 1), ("stop",))  # late: for the generation before
    actor.command(("j", 3), ("batch", 8, 0, None))  # early: overtook the serve call of its generation
    actor.command(("j", 2), ("stop",))
    assert list(actor.serve(SimpleNamespace(job_id="j", generation=2))) == [("stop",)]
    actor.command(("j", 1), ("stop",))  # dropped: generation 2 was served
    assert list(actor.serve(SimpleNamespace(job_id="j", generation=3))) == [("batch", 8, 0, None)]
    actor.command(("k", 2), ("stop",))  # another job's earlier-numbered generation, overtaking its serve
    assert list(actor.serve(SimpleNamespace(job_id="k", generation=2))) == [("stop",)]
