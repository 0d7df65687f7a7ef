"""What runs write and what is read back from it, for real and simulated runs alike.

:mod:`~pollux_opt.records.events` (the unified event log),
:mod:`~pollux_opt.records.replay` (the log folded into per-job tracks),
:mod:`~pollux_opt.records.metrics` (the summary computed from the log),
:mod:`~pollux_opt.records.plots` (figures of runs) and
:mod:`~pollux_opt.records.files` (the one atomic file writer).
"""

from pollux_opt.records.events import EventLog, iter_events, jsonable, read_events, repair_log
from pollux_opt.records.files import atomic_write_bytes, atomic_write_csv, atomic_write_json, atomic_write_text
from pollux_opt.records.metrics import compare_table, summarize
from pollux_opt.records.plots import plot_all
from pollux_opt.records.replay import JobTrack, replay

__all__ = [
    "EventLog", "JobTrack", "atomic_write_bytes", "atomic_write_csv", "atomic_write_json", "atomic_write_text",
    "compare_table", "iter_events", "jsonable", "plot_all", "read_events", "repair_log", "replay", "summarize",
]
