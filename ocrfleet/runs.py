"""`run_id`: the hash of the canonical JSON of everything that changes output.

Any number in the database can be traced to the exact configuration that made it, and two
processes with the same settings and model files agree on the run without talking."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy.orm import Session

from ocrfleet.config import Settings
from ocrfleet.db.models import Run
from ocrfleet.db.upsert import upsert

RUN_SCHEMA = 1  # bump when the meaning of the pipeline changes without a setting changing
# Libraries whose version can change output; a missing one is recorded as None.
LIBRARIES = (
    "onnxruntime",
    "opencv-python",
    "pillow",
    "pypdfium2",
    "rapid-layout",
    "rapidocr",
    "torch",
    "transformers",
)


def library_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def run_config(settings: Settings) -> dict[str, Any]:
    """Every setting and model fingerprint that changes output, without loading any model."""
    from ocrfleet.engines import describe_engines
    from ocrfleet.pipeline.orient import classifier_version
    from ocrfleet.scorers import describe_scorer

    config = {
        "schema": RUN_SCHEMA,
        "dpi": settings.dpi,
        "rec_batch_size": settings.rec_batch_size,
        "seed": settings.seed,
        "engines": describe_engines(settings),
        "scorer": describe_scorer(settings),
        # None: the consensus calibration's per-engine thresholds (its sha is in "scorer").
        "thresholds": {c: settings.threshold(c) for c in ("text", "formula", "table")},
        "layout": settings.layout,
        "libraries": library_versions(),
        "orientation": {
            "version": classifier_version(),
            "min_confidence": settings.orientation_min_confidence,
        },
    }
    if settings.rules is not None:  # only when set: runs without rules keep their ids
        from ocrfleet.pipeline.rules import rules_sha256

        config["rules"] = rules_sha256(settings.rules)
    return config


def run_id_of(config: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def ensure_run(session: Session, config: dict[str, Any]) -> str:
    """Record the run (idempotently) and return its id."""
    run_id = run_id_of(config)
    upsert(session, Run, {"id": run_id, "config": config}, key=["id"], update=[])
    return run_id
