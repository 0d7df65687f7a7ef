"""Reading files that grow: a job's log and the event log, from a byte offset,
followed as they are appended (the API's ``logs?follow=true`` and ``events``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

from starlette.concurrency import run_in_threadpool

__all__ = ["KEEPALIVE_S", "POLL_S", "READ_CHUNK_BYTES", "STREAMED_EVENTS", "event_stream", "follow", "read",
           "read_range", "size"]

#: Seconds between two looks at a followed log or the event log.
POLL_S = 0.25
#: Bytes read from a file at a time.
READ_CHUNK_BYTES = 64 * 1024
#: Seconds without an event after which the event stream sends a comment (keeps proxies from closing it).
KEEPALIVE_S = 15.0
#: The event log's types the event stream sends: state changes and rounds.
STREAMED_EVENTS = frozenset({"submit", "start", "rescale_begin", "rescale_end", "restart_after_fault", "complete",
                             "failed", "cancel", "cancelled", "weight", "state", "allocation"})


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read(path: Path, offset: int, limit: int = READ_CHUNK_BYTES) -> bytes:
    """Up to ``limit`` bytes of ``path`` from ``offset`` (nothing if the file does not exist yet)."""
    try:
        with open(path, "rb") as f:
            if offset >= os.fstat(f.fileno()).st_size:
                return b""  # also spares seek() an offset past what the file system allows
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""


def read_range(path: Path, offset: int, end: int) -> Iterator[bytes]:
    """The bytes of ``path`` from ``offset`` to ``end``, in chunks (the file may grow meanwhile)."""
    while offset < end:
        chunk = read(path, offset, min(READ_CHUNK_BYTES, end - offset))
        if not chunk:
            return
        offset += len(chunk)
        yield chunk


async def follow(path: Path, offset: int, ended: Callable[[], bool]) -> AsyncIterator[bytes]:
    """The bytes of ``path`` from ``offset`` as they are appended, until ``ended()`` and read to the end."""
    while True:
        over = await run_in_threadpool(ended)  # before reading: what the job wrote before it ended is sent
        while chunk := await run_in_threadpool(read, path, offset):
            offset += len(chunk)
            yield chunk
        if over:
            return
        await asyncio.sleep(POLL_S)


def _lines(path: Path, offset: int) -> list[tuple[int, bytes]]:
    """The complete lines of ``path`` from ``offset`` (at most about a chunk), each with the offset after it."""
    out: list[tuple[int, bytes]] = []
    try:
        with open(path, "rb") as f:
            if offset >= os.fstat(f.fileno()).st_size:
                return out
            f.seek(offset)
            read = 0
            while read < READ_CHUNK_BYTES and (line := f.readline()).endswith(b"\n"):
                read += len(line)
                out.append((offset + read, line))
    except FileNotFoundError:
        pass
    return out


async def event_stream(path: Path, offset: int) -> AsyncIterator[str]:
    """Server-sent events of the job events in the event log from ``offset`` on
    (``id``: the offset after the event's line, which ``Last-Event-ID`` resumes from)."""
    quiet = 0.0
    while True:
        lines = await run_in_threadpool(_lines, path, offset)
        for offset, line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not an event: a torn line the log's writer repairs
            if isinstance(event, dict) and event.get("type") in STREAMED_EVENTS:
                quiet = 0.0
                yield f"id: {offset}\ndata: {line.decode('utf-8', 'replace').strip()}\n\n"
        if not lines:
            await asyncio.sleep(POLL_S)
            quiet += POLL_S
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield ": keepalive\n\n"
