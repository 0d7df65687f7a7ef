"""SearchCache: the batch search's first pass kept across calls, with answers equal to the bit."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import numpy as np
import pytest

from pollux_opt.model import BatchLimits, Cluster, GoodputModel, GradientStats, Job, ThroughputParams, allocate
from pollux_opt.model import configs
from pollux_opt.model.batch import best_batch
from pollux_opt.model.goodput import SearchCache, memo_beside_search_cache
from solvers import InvalidProblem

PARAMS = ThroughputParams(
    alpha_c=0.02, beta_c=0.004, alpha_n=0.01, beta_n=0.002, alpha_r=0.05, beta_r=0.01, gamma=2.5, alpha_a=0.005,
    kappa=0.3,
)
#: Limits with an exhaustive first grid, and with a geometric grid and refinement passes.
LIMITS = (
    BatchLimits(16, 256, min_local_bsz=2, max_local_bsz=40, max_accum_steps=3),
    BatchLimits(100, 20000, min_local_bsz=1, max_local_bsz=5000, max_accum_steps=7),
)
NODES = np.array([1, 1, 1, 2, 2, 4, 4, 3])
REPLICAS = np.array([1, 2, 4, 2, 8, 4, 16, 48])
FIELDS = ("goodput", "throughput", "efficiency", "local_bsz", "accum_steps", "batch_size")


def _model(limits: BatchLimits, grad_var: float, params: ThroughputParams = PARAMS) -> GoodputModel:
    return GoodputModel(params, GradientStats(1.0, grad_var, limits.init_batch_size), limits)


def _assert_same_bits(a, b) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name


@pytest.mark.parametrize("limits", LIMITS)
def test_cached_search_repeats_the_uncached_answer_bit_for_bit(limits):
    cache = SearchCache()
    for grad_var in (0.0, 3.0, 20.0, 500.0):  # the statistics change, the throughput parameters do not
        model = _model(limits, grad_var)
        _assert_same_bits(model.optimize(NODES, REPLICAS, cache=cache), model.optimize(NODES, REPLICAS))
    assert cache.misses == 1 and cache.hits == 3


@pytest.mark.parametrize("limits", LIMITS)
def test_split_search_equals_best_batch(limits):
    model = _model(limits, 20.0)
    n, k = (NODES > 1).astype(np.float64) + 1.0, REPLICAS.astype(np.float64)
    m, s = best_batch(model._goodput, limits, n, k)
    m_split, s_split = model._best_batch(n, k, None)
    np.testing.assert_array_equal(m, m_split)
    np.testing.assert_array_equal(s, s_split)
    assert np.any(m > 0)


def test_cache_keys_on_parameter_values_not_objects():
    cache = SearchCache()
    limits = LIMITS[1]
    _model(limits, 20.0).optimize(NODES, REPLICAS, cache=cache)
    _model(limits, 20.0, dataclasses.replace(PARAMS)).optimize(NODES, REPLICAS, cache=cache)  # equal copy
    assert (cache.hits, cache.misses) == (1, 1)
    changed = dataclasses.replace(PARAMS, beta_c=0.005)
    _assert_same_bits(_model(limits, 20.0, changed).optimize(NODES, REPLICAS, cache=cache),
                      _model(limits, 20.0, changed).optimize(NODES, REPLICAS))
    _model(limits, 20.0).optimize(NODES[:3], REPLICAS[:3], cache=cache)  # other allocations
    _model(LIMITS[0], 20.0).optimize(NODES, REPLICAS, cache=cache)  # other limits
    assert (cache.hits, cache.misses, len(cache)) == (1, 4, 4)


def test_cache_stays_within_its_bound_dropping_the_least_recently_used():
    probe = SearchCache()
    _model(LIMITS[1], 20.0).optimize(NODES, REPLICAS, cache=probe)
    one = probe.nbytes
    assert one > 0
    cache = SearchCache(max_bytes=2 * one + one // 2)  # room for two entries of this size
    params = [dataclasses.replace(PARAMS, beta_c=0.004 + 1e-4 * i) for i in range(3)]
    for p in params:
        _model(LIMITS[1], 20.0, p).optimize(NODES, REPLICAS, cache=cache)
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    _model(LIMITS[1], 20.0, params[2]).optimize(NODES, REPLICAS, cache=cache)  # kept: a hit
    _model(LIMITS[1], 20.0, params[0]).optimize(NODES, REPLICAS, cache=cache)  # dropped first: a miss
    assert (cache.hits, cache.misses) == (1, 4)


def test_cache_of_no_bytes_holds_nothing_and_answers_alike():
    cache = SearchCache(max_bytes=0)
    model = _model(LIMITS[1], 20.0)
    for _ in range(2):
        _assert_same_bits(model.optimize(NODES, REPLICAS, cache=cache), model.optimize(NODES, REPLICAS))
    assert len(cache) == 0 and cache.nbytes == 0 and cache.misses == 2


@pytest.mark.parametrize("bound", [-1, 1.5, "big"])
def test_cache_rejects_a_bad_bound(bound):
    with pytest.raises(InvalidProblem, match="max_bytes"):
        SearchCache(max_bytes=bound)


def _jobs(grad_var: float) -> list[Job]:
    limits = BatchLimits(128, 8192, min_local_bsz=8, max_local_bsz=512)
    out = []
    for i, params in enumerate((PARAMS, dataclasses.replace(PARAMS, beta_c=0.001, gamma=1.5))):
        model = GoodputModel(params, GradientStats(1.0, grad_var * (i + 1), 128), limits)
        out.append(Job(f"j{i}", model, max_replicas=16, placement={"n0": 1} if i == 0 else {}))
    return out


def test_allocate_with_a_cache_gives_the_same_allocation_every_round():
    cluster = Cluster.uniform(4, 4)
    cache = SearchCache()
    for grad_var in (5.0, 50.0, 50.0):
        jobs = _jobs(grad_var)
        cached = allocate(cluster, jobs, cache=cache)
        # The speedup memos leave the search cache out of their key: clear them, so that
        # the plain round computes its tables itself.
        configs.model_table.cache_clear()
        configs.model_configs.cache_clear()
        plain = allocate(cluster, jobs)
        assert cached.placement == plain.placement
        assert cached.batch == plain.batch
        assert cached.objective == plain.objective
    assert cache.hits >= 2


def test_memo_keys_without_the_cache_and_computes_with_the_one_passed():
    seen = []

    @memo_beside_search_cache(maxsize=8)
    def square(x, cache=None):
        seen.append(cache)
        return x * x

    first, second = SearchCache(), SearchCache()
    assert square(3, first) == 9 and square(3, cache=second) == 9 and square(3) == 9
    assert square(4, cache=second) == 16
    assert seen == [first, second]
    assert square.cache_info().hits == 2


def test_speedup_memos_do_not_keep_a_finished_schedulers_cache_alive():
    cache = SearchCache()
    allocate(Cluster.uniform(4, 4), _jobs(7.0), cache=cache)
    assert cache.misses > 0
    alive = weakref.ref(cache)
    del cache
    gc.collect()
    assert alive() is None


def test_allocate_rejects_a_cache_of_another_kind():
    with pytest.raises(InvalidProblem, match="cache"):
        allocate(Cluster.uniform(1, 2), _jobs(5.0)[:1], cache={})
