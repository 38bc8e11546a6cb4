"""The start-up check a worker runs after loading its models and before taking a task.

It proves the devices are usable and the models run (one warm-up region through every
recogniser and the scorer), and logs what the worker runs on: device name, free memory,
dtype and model revision. Any failure is a StartupError with a clear message; the worker
then refuses to start (`ocrfleet.tasks.lifecycle` exits with EX_CONFIG).
"""

from __future__ import annotations

import logging
from typing import Any

from PIL import Image, ImageDraw

from ocrfleet import ir
from ocrfleet.tasks.devices import StartupError, device_report
from ocrfleet.toolkit import Toolkit

log = logging.getLogger(__name__)

WARM_UP_TEXT = "Warm up 0123"


def warm_up_page() -> tuple[Image.Image, ir.Region]:
    page = Image.new("RGB", (320, 48), "white")
    ImageDraw.Draw(page).text((8, 16), WARM_UP_TEXT, fill="black")
    return page, ir.Region(number=1, bbox=ir.BBox(x0=0, y0=0, x1=320, y1=48))


def startup_check(toolkit: Toolkit) -> dict[str, Any]:
    """Check devices and run one warm-up region; returns what it logged."""
    from ocrfleet.pipeline.recognise import recognise
    from ocrfleet.pipeline.review import score_units

    models: list[dict[str, Any]] = []
    for part in [*toolkit.recognisers, toolkit.scorer]:
        params = getattr(part, "params", {})
        device = getattr(part, "device", None)
        entry = {
            "name": part.name,
            "version": part.version,
            "dtype": params.get("dtype", "onnx/cpu"),
            **device_report(str(device) if device is not None else "cpu"),
        }
        models.append(entry)
    page, region = warm_up_page()
    candidates = recognise(page, [region], toolkit.recognisers)
    failed = [c for c in candidates if c.error is not None]
    if failed:
        detail = "; ".join(f"{c.engine}: {c.error}" for c in failed)
        raise StartupError(f"warm-up region failed: {detail}")
    scores = score_units(page, [region], candidates, toolkit.scorer)
    if len(scores) != len(candidates):
        raise StartupError(
            f"warm-up: the scorer returned {len(scores)} scores for {len(candidates)} readings"
        )
    report = {"models": models, "warm_up": [c.text for c in candidates]}
    for entry in models:
        log.info(
            "start-up check: %s %s on %s (%s, free %s MiB), dtype %s",
            entry["name"],
            entry["version"],
            entry["device"],
            entry["device_name"],
            entry.get("free_mib", "-"),
            entry["dtype"],
        )
    return report
