"""Sia's simulator calibration (Jayaram Subramanya et al., SOSP 2023; artifact
siasosp23/artifacts, ``sia-simulator/``), offered so that a run can be compared
like for like with Sia's published figures.  Off by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pollux_opt.model.domains import Boolean, Real, check, check_fields, domain_field

__all__ = ["SIA_CALIBRATION", "SIA_DEFAULT_RESTART_DELAY", "SIA_MAX_LOCAL_BSZ", "SIA_RESTART_DELAY", "SiaSimSettings"]

#: A calibration factor or a delay in seconds.
_POSITIVE = Real(gt=0)

#: Slowdown of real runs over Sia's simulator, per application (artifact
#: ``sia-simulator/simulator_config.py``, ``SLOWDOWNS``, "fitted to real-world
#: data"): the simulator multiplies a job's goodput by ``1 / slowdown``.
SIA_CALIBRATION: Mapping[str, float] = {
    "cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5,
}
#: Checkpoint-restore delay per application, seconds (artifact
#: ``sia-simulator/applications.py``, ``Application.rescale_time``; 30 s for others).
SIA_RESTART_DELAY: Mapping[str, float] = {
    "cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0, "imagenet": 250.0, "ncf": 15.0,
}
#: Restart delay of an application not in :data:`SIA_RESTART_DELAY`, seconds (same source).
SIA_DEFAULT_RESTART_DELAY = 30.0
#: Per-type local-batch caps that Sia's simulator sets by hand (artifact
#: ``sia-simulator/applications.py``: deepspeech2 on ``rtx`` at 57).
SIA_MAX_LOCAL_BSZ: Mapping[tuple[str, str], int] = {("deepspeech2", "rtx"): 57}


@dataclass(frozen=True)
class SiaSimSettings:
    """Sia's simulator calibration, off by default (then every factor is 1 and
    restart delays are the simulator's own).

    Attributes:
        enabled: apply Sia's calibration.
        calibration: per-application slowdown (goodput is divided by it).
        restart_delay: per-application checkpoint-restore delay, seconds.
        default_restart_delay: delay of other applications, seconds.
    """

    enabled: bool = domain_field(False, Boolean())
    calibration: Mapping[str, float] = field(default_factory=lambda: dict(SIA_CALIBRATION))
    restart_delay: Mapping[str, float] = field(default_factory=lambda: dict(SIA_RESTART_DELAY))
    default_restart_delay: float = SIA_DEFAULT_RESTART_DELAY

    def __post_init__(self) -> None:
        check_fields(self, prefix="sia settings ")
        for what, table in (("calibration", self.calibration), ("restart_delay", self.restart_delay)):
            for app, v in table.items():
                check(f"sia settings {what}[{app!r}]", v, _POSITIVE)

    def goodput_factor(self, app: str) -> float:
        """``1 / slowdown`` of ``app`` when enabled (1 for unlisted applications), else 1."""
        return 1.0 / float(self.calibration.get(app, 1.0)) if self.enabled else 1.0

    def restart_delay_of(self, app: str) -> float | None:
        """Sia's restart delay of ``app`` in seconds when enabled, else None (the simulator's own)."""
        if not self.enabled:
            return None
        return float(self.restart_delay.get(app, self.default_restart_delay))

    def max_local_bsz(self, app: str, type_name: str) -> int | None:
        """Sia's hand-set local-batch cap of ``app`` on ``type_name`` when enabled, else None."""
        return SIA_MAX_LOCAL_BSZ.get((app, type_name)) if self.enabled else None
