"""The recovery sweeps as one Celery task, `ocrfleet.sweep(name)`, sent by beat.

Acknowledged on receipt (not `acks_late`): a sweep that dies with its worker is simply
run again at its next period, never redelivered into a pile."""

from __future__ import annotations

import logging
from typing import Any

from ocrfleet.tasks import routing
from ocrfleet.tasks.app import app
from ocrfleet.tasks.sweeps import SWEEPS, run_sweep

log = logging.getLogger(__name__)


@app.task(name=routing.SWEEP_TASK, acks_late=False, ignore_result=True)
def sweep(name: str) -> Any:
    if name not in SWEEPS:
        raise ValueError(f"no sweep {name!r}: one of {sorted(SWEEPS)}")
    outcome = run_sweep(name)
    log.info("sweep %s: %s", name, outcome)
    return outcome
