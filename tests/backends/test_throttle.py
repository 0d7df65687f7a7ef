"""CPU-bandwidth throttling of slow node types: quota arithmetic, v1/v2 detection, real cgroups."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.backends.local.throttle import (
    DEFAULT_PERIOD_US,
    PARENT,
    Throttle,
    ThrottleUnavailable,
    clean_stale,
    detect,
    quota_us,
)




def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -------------------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize(
    "fraction, slots, period, expected",
    [(0.5, 1, 100_000, 50_000), (0.25, 4, 100_000, 100_000), (1.0, 2, 50_000, 100_000), (0.001, 1, 1_000, 1_000)],
)
def test_quota_is_fraction_times_slots_times_period(fraction, slots, period, expected):
    assert quota_us(fraction, slots, period) == expected


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 1), r"fraction must be a finite number in \(0, 1\], got 0"),
        ((1.5, 1), r"fraction must be a finite number in \(0, 1\], got 1.5"),
        ((0.5, 0), r"slots must be an integer > 0, got 0"),
        ((0.5, True), r"slots must be an integer > 0, got True"),
        ((0.5, 1, 10), r"period_us must be an integer in \[1000, 1000000\], got 10"),
    ],
)
def test_bad_quota_arguments_are_named(args, match):
    with pytest.raises(InvalidProblem, match=match):
        quota_us(*args)


# ------------------------------------------------------------------------------ fake trees
def _fake_v1(root: Path, name: str = "cpu") -> Path:
    cpu = root / name
    cpu.mkdir(parents=True)
    for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cgroup.procs"):
        (cpu / f).write_text("")
    return cpu


def _fake_v2(root: Path, controllers: str = "cpuset cpu io memory") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_detect_tells_v1_from_v2(tmp_path):
    assert detect(_fake_v2(tmp_path / "v2")).version == 2
    info = detect(_fake_v1(tmp_path / "v1").parent)
    assert info.version == 1 and info.cpu_root == tmp_path / "v1" / "cpu"
    assert detect(_fake_v1(tmp_path / "combined", "cpu,cpuacct").parent).cpu_root.name == "cpu,cpuacct"


def test_detect_explains_a_missing_controller(tmp_path):
    with pytest.raises(ThrottleUnavailable, match="no cgroup cpu controller under"):
        detect(_fake_v2(tmp_path / "v2", controllers="memory io"))
    with pytest.raises(ThrottleUnavailable, match="no cgroup cpu controller"):
        detect(tmp_path)


def test_v1_group_gets_quota_and_period_files(tmp_path):
    cpu = _fake_v1(tmp_path)
    t = Throttle(tmp_path, period_us=50_000)
    g = t.node("rtx-0", fraction=0.5, slots=2)
    assert g == cpu / PARENT / f"{os.getpid()}-rtx-0"
    assert (g / "cpu.cfs_quota_us").read_text() == "50000"
    assert (g / "cpu.cfs_period_us").read_text() == "50000"
    with pytest.raises(InvalidProblem, match="node_id 'rtx-0' already has a cgroup"):
        t.node("rtx-0", fraction=0.5, slots=1)


def test_v2_group_gets_cpu_max_and_delegates_the_controller(tmp_path):
    root = _fake_v2(tmp_path)
    (root / PARENT).mkdir()
    (root / PARENT / "cgroup.subtree_control").write_text("")
    g = Throttle(root).node("slow", fraction=0.25, slots=1)
    assert (g / "cpu.max").read_text() == f"{DEFAULT_PERIOD_US // 4} {DEFAULT_PERIOD_US}"
    assert (root / "cgroup.subtree_control").read_text() == "+cpu"
    assert (root / PARENT / "cgroup.subtree_control").read_text() == "+cpu"


def test_stale_groups_of_dead_owners_are_removed_and_live_ones_kept(tmp_path):
    cpu = _fake_v1(tmp_path)
    base = cpu / PARENT
    (base / f"{_dead_pid()}-n0").mkdir(parents=True)
    (base / f"{os.getpid()}-n1").mkdir()
    removed = clean_stale(detect(tmp_path))
    assert len(removed) == 1 and removed[0].endswith("-n0")
    assert [p.name for p in base.iterdir()] == [f"{os.getpid()}-n1"]


def test_bad_node_arguments_are_named(tmp_path):
    _fake_v1(tmp_path)
    t = Throttle(tmp_path)
    with pytest.raises(InvalidProblem, match="node_id must be letters, digits"):
        t.node("../x", fraction=0.5, slots=1)


# ---------------------------------------------------------------------------- real cgroups
def _cpu_cgroup_of(pid: int, version: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or (controllers == "" and version == 2):
            return path
    return ""


def test_real_group_holds_a_process_and_leaves_nothing_behind(cgroups):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with Throttle() as t:
            g = t.node("probe", fraction=0.5, slots=1)
            (g / "cgroup.procs").write_text(str(sleeper.pid))
            assert (g / "cgroup.procs").read_text().split() == [str(sleeper.pid)]
            assert _cpu_cgroup_of(sleeper.pid, cgroups.version).endswith(f"{PARENT}/{g.name}")
        assert not g.exists()
        assert not (cgroups.cpu_root / PARENT).exists()  # the parent goes with its last group
        assert sleeper.poll() is None  # the process outlives its group, back in the root cgroup
        assert PARENT not in _cpu_cgroup_of(sleeper.pid, cgroups.version)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_real_groups_left_by_a_crashed_scheduler_are_cleaned_by_the_next(cgroups):
    stale = cgroups.cpu_root / PARENT / f"{_dead_pid()}-crashed"
    stale.mkdir(parents=True)
    with Throttle():
        assert not stale.exists()


# --------------------------------------------------------------------------- measured slowdown
_BUSY = """
import sys, time
n, steps = int(sys.argv[1]), int(sys.argv[2])
sys.stdin.readline()
for _ in range(steps):
    t, c = time.perf_counter(), time.process_time()
    x = 0
    for i in range(n):
        x += i * i
    print(time.perf_counter() - t, time.process_time() - c, flush=True)
"""
#: Busy-loop iterations per step: about 0.3 s of one CPU here, three CFS periods or more.
_ITERATIONS = 2_000_000
_STEPS = 5


def _steps(group=None) -> tuple[float, float]:
    """Median step wall time and CPU-seconds per wall-second of a single-threaded busy loop."""
    p = subprocess.Popen(
        [sys.executable, "-c", _BUSY, str(_ITERATIONS), str(_STEPS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    if group is not None:
        (group / "cgroup.procs").write_text(str(p.pid))
    out, _ = p.communicate("go\n", timeout=300)
    rows = [tuple(map(float, line.split())) for line in out.splitlines()]
    wall = statistics.median(w for w, _ in rows)
    return wall, sum(c for _, c in rows) / sum(w for w, _ in rows)


@pytest.mark.slow
def test_half_quota_doubles_a_cpu_bound_step(cgroups):
    with Throttle() as t:
        free = t.node("free", fraction=1.0, slots=1)
        half = t.node("half", fraction=0.5, slots=1)
        base_wall, base_rate = _steps(free)
        if base_rate < 0.8:
            pytest.skip(f"CPUs contended: the unthrottled loop got {base_rate:.2f} CPU-s per s, "
                        "so a 0.5 quota cannot bind")
        wall, _ = _steps(half)
    assert 1.6 <= wall / base_wall <= 2.4


@pytest.mark.slow
def test_quota_caps_the_cpu_rate_even_on_a_contended_machine(cgroups):
    with Throttle() as t:
        _, base_rate = _steps(t.node("free", fraction=1.0, slots=1))
        # well below what contention leaves one process, so that the quota binds
        fraction = round(max(0.05, min(0.2, base_rate / 3)), 3)
        g = t.node("capped", fraction=fraction, slots=1)
        _, rate = _steps(g)
        stat = dict(line.split()[:2] for line in (g / "cpu.stat").read_text().splitlines())
    assert rate <= fraction * 1.25, f"{rate:.3f} CPU-s per s under a {fraction} quota"
    assert int(stat["nr_throttled"]) > 0  # the kernel did hold the group back
