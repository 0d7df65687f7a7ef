"""The live console view of a real run: :class:`ConsoleProgress`."""

from __future__ import annotations

from typing import Callable, Sequence

from pollux_opt.model import Cluster
from pollux_opt.scheduling.loop import Decision, JobView
from pollux_opt.workloads.job import Workload

__all__ = ["ConsoleProgress"]


class ConsoleProgress:
    """Live progress table (rich, on stderr): jobs done, elapsed time and the current allocation.

    Used as the ``progress`` callback of :func:`pollux_opt.scheduling.loop.run`;
    refreshed once per round (no refresh thread, so it costs no CPU between
    rounds).  Off a terminal it prints one line per round instead.
    """

    def __init__(self, policy: str, workload: Workload, cluster: Cluster) -> None:
        from rich.console import Console

        self.policy, self.workload, self.cluster = policy, workload, cluster
        self.console = Console(stderr=True)
        self._live = None
        #: returns the number of finished jobs (set by run_workload to the backend's count)
        self.done_fn: Callable[[], int] | None = None

    def __enter__(self) -> "ConsoleProgress":
        from rich.live import Live

        if self.console.is_terminal:
            self._live = Live(console=self.console, auto_refresh=False, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, now: float, views: Sequence[JobView], decision: Decision) -> None:
        """Show round ``now`` (run seconds): each job's state, CPUs, batch size, progress, restarts."""
        from rich.table import Table

        total = len(self.workload.jobs)
        done = self.done_fn() if self.done_fn is not None else 0
        table = Table(title=f"{self.policy} on {self.workload.name}: {done}/{total} jobs done, "
                            f"t = {now:.0f} s, {self.cluster.total_cpus} CPUs", title_justify="left")
        for col in ("job", "state", "CPUs", "batch", "progress", "restarts"):
            table.add_column(col)
        for v in views:
            p = decision.placement.get(v.job_id, {})
            table.add_row(v.job_id, v.state.value, str(sum(p.values())), str(v.batch_size) if v.batch_size else "-",
                          f"{v.progress:.0f}", str(v.restarts))
        if self._live is not None:
            self._live.update(table, refresh=True)
        else:
            alloc = ", ".join(f"{v.job_id}:{sum(decision.placement.get(v.job_id, {}).values())}" for v in views)
            self.console.print(f"[{self.policy}] t={now:.0f}s done {done}/{total} alloc {alloc}")
