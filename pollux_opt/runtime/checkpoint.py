"""Atomic checkpoints with integrity checks and fallback to the previous good one.

A checkpoint at optimizer step ``t`` is two files in ``<workdir>/checkpoints``:

* ``ckpt-<t>.pt``: ``torch.save`` of the model, optimizer, scaler and RNG
  states and the runtime state (data position, progress, statistics, profile);
* ``ckpt-<t>.json``: metadata readable without torch (step, progress,
  measurements, fitted model, metric) including the SHA-256 of the ``.pt`` bytes.

Each file is written atomically and durably by
:func:`pollux_opt.records.files.atomic_write_bytes`, the ``.json`` after the
``.pt``, so a checkpoint exists only once both are complete.  A reader takes
the newest checkpoint whose metadata parses and whose ``.pt`` hashes to the
recorded digest; a corrupt one is renamed to ``*.corrupt`` (kept for
inspection) and the previous one is used instead.

**One writer.**  Rank 0 of a job's current generation, the only process that
writes its checkpoints, holds an exclusive ``fcntl.flock`` on
``checkpoints/writer.lock`` while it trains (:class:`WriterLock`), and a
controller about to choose the checkpoint to resume from waits until no one
holds it (:func:`wait_for_writer`): after a scheduler was killed, its rank 0
may still be writing its last step when a new scheduler resumes the job.  The
kernel drops the lock of a process that ends, however it ends.  Where
``fcntl`` is missing (Windows) there is no lock.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pollux_opt.records import files

__all__ = [
    "CheckpointInfo",
    "WriterLock",
    "atomic_write_json",
    "checkpoint_dir",
    "latest_good",
    "list_checkpoints",
    "load_payload",
    "prune",
    "save_checkpoint",
    "verify",
    "wait_for_writer",
]

logger = logging.getLogger(__name__)

_META_RE = re.compile(r"^ckpt-(\d+)\.json$")
#: Seconds between two tries of a held writer lock.
_LOCK_POLL_S = 0.05


def checkpoint_dir(workdir: Path) -> Path:
    return Path(workdir) / "checkpoints"


#: ``atomic_write_json(path, obj)``: the runtime's JSON (sorted keys, nan allowed:
#: job state may hold nan before a first measurement).
atomic_write_json = functools.partial(files.atomic_write_json, indent=1, sort_keys=True, allow_nan=True)


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint on disk: its step, files and metadata (a JSON object)."""

    step: int
    path: Path
    meta_path: Path
    meta: dict

    @property
    def final(self) -> bool:
        return bool(self.meta.get("final", False))


def _paths(directory: Path, step: int) -> tuple[Path, Path]:
    return directory / f"ckpt-{step:010d}.pt", directory / f"ckpt-{step:010d}.json"


def list_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """Checkpoints whose metadata parses, newest step first (payloads not verified)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _META_RE.match(entry.name)
        if not match:
            continue
        try:
            meta = json.loads(entry.read_text())
        except (OSError, ValueError):
            logger.warning("checkpoint metadata %s is unreadable; ignoring it", entry)
            continue
        if not isinstance(meta, dict) or "sha256" not in meta:
            continue
        step = int(match.group(1))
        found.append(CheckpointInfo(step, _paths(directory, step)[0], entry, meta))
    found.sort(key=lambda info: info.step, reverse=True)
    return found


def verify(info: CheckpointInfo) -> bool:
    """True if the payload file exists and hashes to the recorded SHA-256."""
    try:
        with open(info.path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest() == info.meta["sha256"]
    except OSError:
        return False


def latest_good(
    directory: Path, on_corrupt: Callable[[CheckpointInfo], None] | None = None
) -> CheckpointInfo | None:
    """The newest checkpoint that verifies; corrupt newer ones are quarantined.

    Args:
        directory: the checkpoint directory.
        on_corrupt: called with each corrupt checkpoint skipped (before quarantine).
    """
    for info in list_checkpoints(directory):
        if verify(info):
            return info
        logger.warning("checkpoint %s is corrupt (digest mismatch or missing); falling back", info.path)
        if on_corrupt is not None:
            on_corrupt(info)
        for path in filter(Path.exists, (info.path, info.meta_path)):
            try:
                path.replace(path.with_name(path.name + ".corrupt"))
            except OSError:  # pragma: no cover - best effort
                logger.exception("could not quarantine %s", path)
    return None


def save_checkpoint(directory: Path, step: int, payload: dict, meta: dict) -> CheckpointInfo:
    """Write checkpoint ``step`` atomically (payload via ``torch.save``, then metadata).

    ``meta`` must be JSON-serialisable; ``step``, ``sha256`` and ``bytes`` are added.
    """
    import torch  # lazy: only workers save checkpoints

    directory = Path(directory)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    path, meta_path = _paths(directory, step)
    meta = dict(meta, step=int(step), sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    files.atomic_write_bytes(path, data)
    atomic_write_json(meta_path, meta)
    return CheckpointInfo(int(step), path, meta_path, meta)


def load_payload(info: CheckpointInfo) -> dict:
    """Read and verify a checkpoint's payload; ValueError if it does not match its digest."""
    import torch

    data = Path(info.path).read_bytes()
    if hashlib.sha256(data).hexdigest() != info.meta["sha256"]:
        raise ValueError(f"checkpoint {info.path} does not match its recorded SHA-256")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (final ones are always kept),
    and stray temporary files and payloads without metadata."""
    directory = Path(directory)
    infos = list_checkpoints(directory)
    for info in infos[keep:]:
        if info.final:
            continue
        info.meta_path.unlink(missing_ok=True)
        info.path.unlink(missing_ok=True)
    known = {info.path.name for info in infos[:keep]} | {info.path.name for info in infos if info.final}
    for entry in directory.iterdir():
        if entry.name.startswith(".") and ".tmp-" in entry.name:
            # Another process may be writing it right now; only this job's
            # rank 0 writes here, and it calls prune after its own writes.
            entry.unlink(missing_ok=True)
        elif entry.suffix == ".pt" and entry.name not in known:
            if not entry.with_suffix(".json").exists():
                entry.unlink(missing_ok=True)


class WriterLock:
    """The exclusive lock on a job's checkpoints that its writer holds (see the module docstring)."""

    def __init__(self, workdir: Path) -> None:
        self.path = checkpoint_dir(workdir) / "writer.lock"
        self._fd: int | None = None

    def acquire(self, timeout_s: float) -> bool:
        """Take the lock, waiting up to ``timeout_s`` seconds; False if it stayed
        held (the caller goes on without it); True where there is no ``fcntl``."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no lock to hold
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(_LOCK_POLL_S)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def wait_for_writer(workdir: Path, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds until no process writes ``workdir``'s
    checkpoints; True if none does (or there is no ``fcntl``), False if one still held the lock."""
    lock = WriterLock(workdir)
    free = lock.acquire(timeout_s)
    lock.release()
    return free
