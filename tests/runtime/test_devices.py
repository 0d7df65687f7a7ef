"""A replica's device without CUDA: which GPU a process binds, which backend a job's
collectives use, which warm worker serves which slot, and state that follows a
replica to its device (torch's ``meta`` device stands in for a GPU)."""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import pollux_opt.elastic as elastic  # noqa: E402
from pollux_opt.runtime.allocation import WorkerAllocation, parse_allocation  # noqa: E402
from pollux_opt.runtime.device import GpuBinding, collective_backend, to_device  # noqa: E402
from pollux_opt.runtime.pool import WorkerPool, serves  # noqa: E402
from pollux_opt.runtime.spec import JobParts  # noqa: E402
from pollux_opt.runtime.state import TrainingState, rng_state  # noqa: E402
from pollux_opt.runtime.user_loop import _CURRENT, UserLoop  # noqa: E402
from pollux_opt.runtime.worker import load_state  # noqa: E402
from pollux_opt.model import BatchLimits  # noqa: E402
from solvers import InvalidProblem  # noqa: E402

META = torch.device("meta")


class _FakeCuda:
    """torch.cuda as a process without a GPU would need it to bind one: records the device set."""

    def __init__(self, initialized: bool = False) -> None:
        self.initialized, self.current = initialized, None

    def is_initialized(self) -> bool:
        return self.initialized

    def set_device(self, device) -> None:
        self.current, self.initialized = device, True


def _torch_with(cuda: _FakeCuda):
    return SimpleNamespace(device=torch.device, cuda=cuda)


def test_a_gpu_replica_sees_only_its_gpu():
    env: dict = {}
    cuda = _FakeCuda()
    binding = GpuBinding(env)
    assert binding.device(_torch_with(cuda), None) == torch.device("cpu")
    assert env == {} and cuda.current is None  # a CPU replica binds nothing
    assert binding.device(_torch_with(cuda), 1) == torch.device("cuda", 0)
    assert env == {"CUDA_VISIBLE_DEVICES": "1"} and cuda.current == torch.device("cuda", 0)
    assert binding.device(_torch_with(cuda), 1) == torch.device("cuda", 0)  # the same GPU again: fine


def test_gpu_numbers_are_those_of_the_gpus_the_user_made_visible():
    env = {"CUDA_VISIBLE_DEVICES": "2, 5"}
    GpuBinding(env).device(_torch_with(_FakeCuda()), 1)
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    with pytest.raises(RuntimeError, match=r"GPU 2 is not one of the 2 visible \(CUDA_VISIBLE_DEVICES=2,5\)"):
        GpuBinding({"CUDA_VISIBLE_DEVICES": "2,5"}).device(_torch_with(_FakeCuda()), 2)


def test_a_ray_actor_keeps_the_gpu_ray_gave_it():
    env = {"CUDA_VISIBLE_DEVICES": "3"}  # Ray's, for an actor holding num_gpus=1
    GpuBinding(env).device(_torch_with(_FakeCuda()), 0)
    assert env == {"CUDA_VISIBLE_DEVICES": "3"}


def test_a_process_bound_to_one_gpu_refuses_another():
    binding, cuda = GpuBinding({}), _FakeCuda()
    binding.device(_torch_with(cuda), 0)
    with pytest.raises(RuntimeError, match="bound to GPU 0; it cannot serve GPU 1"):
        binding.device(_torch_with(cuda), 1)
    with pytest.raises(RuntimeError, match="bound to another GPU; it cannot serve GPU 0"):  # CUDA already started
        GpuBinding({}).device(_torch_with(_FakeCuda(initialized=True)), 0)


def test_nccl_only_where_every_replica_has_a_gpu():
    assert collective_backend([0, 1]) == "nccl"
    assert collective_backend([0, None]) == "gloo"
    assert collective_backend([None]) == "gloo"
    assert collective_backend(None) == "gloo"


def test_to_device_moves_every_tensor_in_nested_batches():
    Pair = namedtuple("Pair", "x y")
    batch = {"a": (torch.ones(2), [torch.zeros(1), 3]), "b": Pair(torch.ones(1), "label")}
    moved = to_device(batch, META)
    assert moved["a"][0].device == META and moved["a"][1][0].device == META and moved["a"][1][1] == 3
    assert isinstance(moved["b"], Pair) and moved["b"].x.device == META and moved["b"].y == "label"
    cpu = torch.ones(3)
    assert to_device(cpu, torch.device("cpu")) is cpu  # already there: not copied


@pytest.mark.filterwarnings("ignore:.*meta parameter")  # a meta tensor holds no values to copy into
def test_a_checkpoint_resumes_on_another_device_with_the_optimizer_state_there():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    state = TrainingState(step=7)
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng_state(torch),
               "runtime": state.to_dict()}
    other = torch.nn.Linear(3, 2).to(META)  # the next generation's replica on another device
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    parts = JobParts(model=other, optimizer=other_opt, train_size=1, get_batch=None, loss=None, evaluate=None)
    restored = load_state(torch, parts, payload)
    assert restored.step == 7
    buffers = [s["momentum_buffer"] for s in other_opt.state.values()]
    assert len(buffers) == 2 and all(b.device == META for b in buffers)
    assert all(p.device == META for p in other.parameters())


def test_a_users_model_and_elastic_device_are_the_replicas_device():
    spec = SimpleNamespace(target=None, name="j")
    seen = {}

    def attach(user_loop, parts, extra):
        seen["device"] = next(parts.model.parameters()).device
        return "trainer"

    loop = UserLoop(spec, 0, 1, attach, META)
    token = _CURRENT.set(loop)
    try:
        assert elastic.device() == META
        model = torch.nn.Linear(2, 2)
        loop.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    finally:
        _CURRENT.reset(token)
    assert seen["device"] == META
    assert elastic.device() == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))


def _worker(gpu=None, alive=True, job_key=None):
    return SimpleNamespace(gpu=gpu, alive=lambda: alive, job_key=job_key)


def test_a_worker_bound_to_a_gpu_serves_only_that_gpu():
    assert serves(_worker(), None) and serves(_worker(), 0)
    assert serves(_worker(gpu=0), 0)
    assert not serves(_worker(gpu=0), 1) and not serves(_worker(gpu=0), None)


def test_regroup_keeps_each_rank_on_a_worker_that_can_serve_its_slot():
    """A job moving from GPUs 0 and 1 to GPU 1 and a CPU core keeps the worker
    bound to GPU 1, lets the one bound to GPU 0 go, and takes a CPU worker."""
    on0, on1, cpu_worker = _worker(gpu=0), _worker(gpu=1), _worker()
    released, acquired = [], []

    def acquire(count, job_key=None, gpu=None):
        acquired.append(gpu)
        return [_worker() for _ in range(count)]

    idle = []

    def take_bound(gpu, job_key=None):
        return next((w for w in idle if w.gpu == gpu), None)

    pool = SimpleNamespace(release=released.extend, acquire=acquire, take_bound=take_bound)
    alloc = WorkerAllocation({"gpu-0": 1, "cpu-0": 1}, gpus=(1, None))
    out = WorkerPool.regroup(pool, [on0, on1], alloc, job_key="j")
    assert out[0] is on1 and out[1] is not on0 and released == [on0] and acquired == [None]
    # back to GPU 0 from a CPU core: the idle worker bound to GPU 0 (its CUDA up) before the job's CPU worker
    idle.append(on0)
    out = WorkerPool.regroup(pool, [cpu_worker], WorkerAllocation({"gpu-0": 1}, gpus=(0,)), job_key="j")
    assert out == [on0] and cpu_worker.gpu is None
    # with none idle there, an unbound worker takes the GPU rank and is bound to it
    idle.clear()
    out = WorkerPool.regroup(pool, [cpu_worker], WorkerAllocation({"gpu-0": 1}, gpus=(0,)), job_key="j")
    assert out == [cpu_worker] and cpu_worker.gpu == 0


def test_an_allocation_lists_one_gpu_or_none_per_replica():
    limits = BatchLimits(init_batch_size=8, min_local_bsz=1, max_local_bsz=64, max_batch_size=128, max_accum_steps=4)
    alloc = parse_allocation(limits, None, {"gpu-0": 1, "cpu-0": 1}, None, None, None, None, gpus=[0, None])
    assert alloc.rank_gpus() == [0, None]
    assert not alloc.same_workers(parse_allocation(limits, None, {"gpu-0": 1, "cpu-0": 1}, None, None, None, None,
                                                   gpus=[1, None]))
    only_cpus = parse_allocation(limits, None, 2, None, None, None, None, gpus=[None, None])
    assert only_cpus.gpus is None and only_cpus.rank_gpus() == [None, None]
    with pytest.raises(InvalidProblem, match=r"gpus must list one GPU index >= 0 \(or None: CPU cores\) per replica"):
        parse_allocation(limits, None, 2, None, None, None, None, gpus=[0])
    with pytest.raises(InvalidProblem, match="gpus must list"):
        parse_allocation(limits, None, 1, None, None, None, None, gpus=[-1])


def test_the_gpu_measurements_rescale_across_gpus_or_between_a_gpu_and_a_core(experiment):
    rm = experiment("runtime_measurements")
    assert rm._rescale_targets(None) == [(k, None) for k in rm.RESCALE_SEQUENCE]
    assert rm._rescale_targets([0, 1]) == [(k, [0, 1][:k]) for k in rm.RESCALE_SEQUENCE]
    one = rm._rescale_targets([0])
    assert {k for k, _ in one} == {1} and [on for _, on in one[:2]] == [None, [0]]  # from the GPU to a core and back
    spec = SimpleNamespace(init_batch_size=32, max_local_bsz=256, min_local_bsz=1)
    configs, train = rm.profile_configs(spec, (1,))
    assert {k for k, _, _ in configs} == {1} and not all(train) and any(train)


def _assignments(tmp_path, alloc):
    """The assignments a generation on ``alloc`` sends its workers."""
    from pollux_opt.model import BatchConfig
    from pollux_opt.runtime.generation import Generation
    from pollux_opt.runtime.report import RuntimeOptions

    sent = []
    pool = SimpleNamespace(
        regroup=lambda workers, alloc, job_key=None: [SimpleNamespace(job_key=None, send=lambda *m: sent.append(m[1]))
                                                      for _ in range(alloc.num_replicas)],
        rendezvous=lambda workers, workdir, generation: str(tmp_path / "store"))
    previous = SimpleNamespace(number=0, workers=[], paused={})
    Generation.launch(pool, previous, alloc, BatchConfig(8, 0), "start", 0.0, None, job_id="j", spec_json="{}",
                      workdir=str(tmp_path), options=RuntimeOptions(), params=None)
    return sent


def test_a_job_over_gpus_and_cores_or_two_gpu_types_reduces_with_gloo_or_resynchronises(tmp_path):
    def run(placement, gpus, types=None):
        sent = _assignments(tmp_path, WorkerAllocation(placement, gpus=gpus, node_types=types))
        assert len({(a.backend, a.mixed) for a in sent}) == 1  # every rank alike
        return [a.gpu for a in sent], sent[0].backend, sent[0].mixed

    assert run({"g": 2}, (0, 1)) == ([0, 1], "nccl", False)
    assert run({"g": 1, "c": 1}, (0, None)) == ([0, None], "gloo", True)
    assert run({"a": 1, "b": 1}, (0, 1), {"a": "a100", "b": "t4"}) == ([0, 1], "nccl", True)
    assert run({"c": 2}, None) == ([None, None], "gloo", False)


def test_take_bound_hands_out_an_idle_worker_of_that_gpu_warm_for_the_job_first():
    pool = WorkerPool(spares=0)
    try:
        cold, warm, other = (SimpleNamespace(gpu=g, job_key=k, created=c, alive=lambda: True)
                             for g, k, c in ((0, None, 1.0), (0, "j", 2.0), (1, "j", 0.0)))
        pool._idle = [cold, warm, other]
        assert pool.take_bound(0, "j") is warm and pool.take_bound(0, "j") is cold
        assert pool.take_bound(0, "j") is None and pool._idle == [other]
    finally:
        pool._idle = []
        pool.close()
