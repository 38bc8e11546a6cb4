"""The beat schedule, in code: which recovery sweep runs how often."""

from __future__ import annotations

from typing import Any

from ocrfleet.config import Settings
from ocrfleet.tasks import routing


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each sweep expires if no worker took it within its own period, so a stalled fleet
    does not pile sweeps up; `run_every` seconds."""
    every = {
        "orphans": settings.sweep_interval_s,
        "lost": max(settings.sweep_interval_s, 60.0),
        "retention": 3600.0,
    }
    if settings.intake_prefix:
        every["intake"] = max(settings.sweep_interval_s, 60.0)
    return {
        f"ocrfleet-sweep-{name}": {
            "task": routing.SWEEP_TASK,
            "schedule": seconds,
            "args": (name,),
            "options": {"queue": routing.SWEEP_QUEUE, "expires": seconds},
        }
        for name, seconds in every.items()
    }
