"""Slower node types on one machine: replicas under a CPU-bandwidth limit (a cgroup CPU quota).

A node of a slow type runs its replica processes in a cgroup whose CFS
bandwidth limit lets them use ``fraction x slots`` CPUs: ``quota / period``
CPU-seconds per second (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` on
cgroup v1, ``cpu.max`` = ``"quota period"`` on v2).  A CPU-bound replica with
``fraction = 0.5`` then takes twice as long per step: a real, measurable
slowdown, the CPU analogue of a slower GPU type.

Every cgroup lives under one parent (:data:`PARENT`), named
``<owner pid>-<node id>``: :func:`clean_stale` removes those whose owner
(the scheduler process) is gone, after a crash; :class:`Throttle` removes its
own on close.  Where cgroups cannot be written (no controller, not root, a
read-only mount) :func:`detect` raises :class:`ThrottleUnavailable` with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from solvers import InvalidProblem

from pollux_opt.model.domains import NAME, Integer, Real, check
from pollux_opt.runtime.lifeline import process_exists

__all__ = [
    "DEFAULT_PERIOD_US",
    "MIN_QUOTA_US",
    "PARENT",
    "CgroupInfo",
    "Throttle",
    "ThrottleUnavailable",
    "clean_stale",
    "detect",
    "quota_us",
]

LOG = logging.getLogger(__name__)

#: Where cgroup file systems are mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The one parent of every cgroup this module creates.
PARENT = "pollux-opt"
#: CFS bandwidth period, microseconds (the kernel's default, 100 ms).
DEFAULT_PERIOD_US = 100_000
#: Smallest quota the kernel accepts, microseconds (1 ms; kernel docs, sched-bwc).
MIN_QUOTA_US = 1_000

#: Tries to empty and remove a cgroup whose processes keep forking.
_REMOVE_ATTEMPTS = 5

_FRACTION = Real(gt=0, le=1)
_SLOTS = Integer(gt=0)
_PERIOD = Integer(ge=MIN_QUOTA_US, le=1_000_000)


class ThrottleUnavailable(RuntimeError):
    """CPU quotas cannot be set here; the message says why."""


@dataclass(frozen=True)
class CgroupInfo:
    """The cgroup hierarchy that holds the ``cpu`` controller: its ``version`` (1
    or 2) and ``cpu_root``, the directory of its root cgroup."""

    version: int
    cpu_root: Path


def quota_us(fraction: float, slots: int, period_us: int = DEFAULT_PERIOD_US) -> int:
    """CFS quota (microseconds per period) for ``slots`` replica slots at ``fraction``
    of a CPU each: ``round(fraction * slots * period_us)``, at least :data:`MIN_QUOTA_US`.

    Raises:
        InvalidProblem: fraction not in (0, 1], slots < 1, period out of [1 ms, 1 s].
    """
    fraction = check("fraction", fraction, _FRACTION)
    slots = check("slots", slots, _SLOTS)
    period_us = check("period_us", period_us, _PERIOD)
    return max(MIN_QUOTA_US, round(fraction * slots * period_us))


def detect(root: str | os.PathLike = CGROUP_ROOT) -> CgroupInfo:
    """Which cgroup version carries the ``cpu`` controller under ``root``, and whether it is writable.

    v2: ``root/cgroup.controllers`` lists ``cpu``; v1: ``root/cpu/cpu.cfs_quota_us``
    exists (``root/cpu,cpuacct`` as on some distributions too).

    Raises:
        ThrottleUnavailable: no cpu controller, or not writable by this process.
    """
    root = Path(root)
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        info = CgroupInfo(2, root)
    else:
        v1 = next((root / d for d in ("cpu", "cpu,cpuacct") if (root / d / "cpu.cfs_quota_us").is_file()), None)
        if v1 is None:
            raise ThrottleUnavailable(f"no cgroup cpu controller under {str(root)!r} (neither v2 nor v1)")
        info = CgroupInfo(1, v1)
    if not os.access(info.cpu_root, os.W_OK):
        raise ThrottleUnavailable(f"cgroup cpu controller at {str(info.cpu_root)!r} is not writable by this process")
    return info


def _procs(group: Path) -> list[int]:
    try:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _remove(info: CgroupInfo, group: Path) -> None:
    """Move ``group``'s processes back to the root cgroup, then remove it (again, a
    few times, where a process forked meanwhile and the kernel refused with EBUSY)."""
    for attempt in range(_REMOVE_ATTEMPTS):
        for pid in _procs(group):
            try:
                (info.cpu_root / "cgroup.procs").write_text(str(pid))
            except OSError as exc:  # the process exited meanwhile
                if exc.errno != errno.ESRCH:
                    raise
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == _REMOVE_ATTEMPTS - 1:
                raise


def clean_stale(info: CgroupInfo) -> list[str]:
    """Remove the cgroups under :data:`PARENT` whose owner process is gone; returns their names."""
    base = info.cpu_root / PARENT
    if not base.is_dir():
        return []
    removed = []
    for group in sorted(p for p in base.iterdir() if p.is_dir()):
        owner = group.name.split("-", 1)[0]
        if owner.isdigit() and not process_exists((int(owner), None)):
            _remove(info, group)
            removed.append(group.name)
    if removed:
        LOG.info("removed %d stale cgroups under %s: %s", len(removed), base, removed)
    return removed


class Throttle:
    """Creates throttled node cgroups, of CFS period ``period_us``, under
    :data:`PARENT` of the cgroup tree at ``root``; removes them on close.

    Raises:
        ThrottleUnavailable: see :func:`detect`.
    """

    def __init__(self, root: str | os.PathLike = CGROUP_ROOT, *, period_us: int = DEFAULT_PERIOD_US) -> None:
        self.info = detect(root)
        self.period_us = check("period_us", period_us, _PERIOD)
        #: ``{node id: cgroup directory}`` of the groups it created.
        self.groups: dict[str, Path] = {}
        base = self.info.cpu_root / PARENT
        try:
            base.mkdir(exist_ok=True)
            if self.info.version == 2:  # a child may only use the controllers its parent delegates
                for level in (self.info.cpu_root, base):
                    if "cpu" not in (level / "cgroup.subtree_control").read_text().split():
                        (level / "cgroup.subtree_control").write_text("+cpu")
        except OSError as exc:
            raise ThrottleUnavailable(f"cannot create cgroup {str(base)!r}: {exc}") from None
        clean_stale(self.info)

    def node(self, node_id: str, *, fraction: float, slots: int) -> Path:
        """The directory of a new cgroup for ``node_id`` whose processes share
        ``fraction x slots`` CPUs (a process joins by writing its pid to ``cgroup.procs``)."""
        node_id = check("node_id", node_id, NAME)
        if node_id in self.groups:
            raise InvalidProblem(f"node_id {node_id!r} already has a cgroup")
        quota = quota_us(fraction, slots, self.period_us)
        path = self.info.cpu_root / PARENT / f"{os.getpid()}-{node_id}"
        try:
            path.mkdir(exist_ok=True)
            if self.info.version == 2:
                (path / "cpu.max").write_text(f"{quota} {self.period_us}")
            else:
                (path / "cpu.cfs_period_us").write_text(str(self.period_us))
                (path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as exc:
            raise ThrottleUnavailable(f"cannot set a CPU quota on {str(path)!r}: {exc}") from None
        self.groups[node_id] = path
        return path

    def close(self) -> None:
        """Move every process back to the root cgroup and remove this throttle's cgroups."""
        while self.groups:
            _remove(self.info, self.groups.popitem()[1])
        with contextlib.suppress(OSError):  # the shared parent goes with its last child (unless another's remain)
            (self.info.cpu_root / PARENT).rmdir()

    def __enter__(self) -> "Throttle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
