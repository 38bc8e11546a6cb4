"""`run_id`: the hash of the canonical JSON of everything that changes output.

Any number in the database can be traced to the exact configuration that made it, and two
processes with the same settings and model files agree on the run without talking. Only
what the configured engines, scorer and layout use enters it: a library no part of the
run imports (torch for a CPU run) never does, so a submitter installed without it and a
worker installed with it compute one run.

A process that has not the engines' files (an upload service, an ingest pod without the
models) uses the pinned `OCRFLEET_RUN_ID` instead of computing it; a process that runs
pages always computes its run, and refuses a pin it does not match."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy.orm import Session

from ocrfleet.config import Settings
from ocrfleet.db.models import Run
from ocrfleet.db.upsert import upsert
from ocrfleet.errors import ConfigError, describe

# Bump when the meaning of the pipeline changes without a setting changing.
# 2: libraries by use; precheck, engine timeout and input limits entered.
RUN_SCHEMA = 2
# Libraries every run uses, whatever its engines: images are loaded and PDFs rendered
# (Pillow, pypdfium2), pages turned upright (OpenCV, onnxruntime) and lines found by
# RapidOCR's detector. Each engine and scorer adds its own (`engine_libraries`,
# `scorer_libraries`).
BASE_LIBRARIES = ("onnxruntime", "opencv-python", "pillow", "pypdfium2", "rapidocr")
PIN_HINT = (
    "pin the run with OCRFLEET_RUN_ID: `ocrfleet run-id --register`, run where a worker's "
    "models are, prints it and registers it"
)


class RunConfigError(ConfigError):
    """This process cannot compute its run (a model file or binary it lacks): exit 2."""


class PinMismatch(ConfigError):
    """`OCRFLEET_RUN_ID` names another run than this process's settings and files make."""


class OtherRun(Exception):
    """The work (of document `document_id`) belongs to another run than this worker's: it
    is left for a worker of that run, never failed."""

    def __init__(self, run_id: str, own: str, document_id: int | None = None) -> None:
        super().__init__(f"work of run {run_id}, this worker runs {own}")
        self.run_id = run_id
        self.own = own
        self.document_id = document_id


def libraries(settings: Settings) -> dict[str, str | None]:
    """Versions of the libraries this configuration uses; a missing one is None."""
    from importlib.metadata import PackageNotFoundError, version

    from ocrfleet.engines import engine_libraries
    from ocrfleet.scorers import scorer_libraries

    names = {*BASE_LIBRARIES, *engine_libraries(settings), *scorer_libraries(settings)}
    found: dict[str, str | None] = {}
    for name in sorted(names):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def run_config(settings: Settings) -> dict[str, Any]:
    """Every setting and model fingerprint that changes output, without loading any model.
    RunConfigError when a part cannot be described here (a checkpoint folder, model file
    or binary this process does not have)."""
    from ocrfleet.checkpoints import CheckpointError
    from ocrfleet.engines import describe_engines
    from ocrfleet.pipeline.orient import classifier_version
    from ocrfleet.scorers import describe_scorer

    try:
        engines, scorer = describe_engines(settings), describe_scorer(settings)
        orientation = classifier_version()
    except (CheckpointError, OSError, ValueError, RuntimeError) as exc:
        raise RunConfigError(f"cannot compute the run here: {describe(exc)}; {PIN_HINT}") from exc
    config = {
        "schema": RUN_SCHEMA,
        "dpi": settings.dpi,
        "rec_batch_size": settings.rec_batch_size,
        "seed": settings.seed,
        "engines": engines,
        "scorer": scorer,
        # None: the consensus calibration's per-engine thresholds (its sha is in "scorer").
        "thresholds": {c: settings.threshold(c) for c in ("text", "formula", "table")},
        "layout": settings.layout,
        "libraries": libraries(settings),
        "orientation": {
            "version": orientation,
            "min_confidence": settings.orientation_min_confidence,
        },
        "text_layer": text_layer_config(settings),
        # Over a limit an input is `rejected`: the limits decide a document's outcome.
        "limits": {
            "max_input_bytes": settings.max_input_bytes,
            "max_pages": settings.max_pages,
            "max_pixels": settings.max_pixels,
        },
    }
    if settings.rules is not None:  # only when set: runs without rules keep their ids
        from ocrfleet.pipeline.rules import rules_sha256

        config["rules"] = rules_sha256(settings.rules)
    return config


def text_layer_config(settings: Settings) -> dict[str, Any]:
    """Whether PDF text layers are used, and what makes one good enough to use."""
    from ocrfleet.pipeline import textlayer as tl

    if settings.text_layer == "redo":
        return {"mode": "redo"}
    thresholds = (tl.MIN_CHARS, tl.MIN_LINES, tl.MAX_UNMAPPED, tl.MIN_INK_COVERAGE, tl.INK_LEVEL)
    return {"mode": "use", "version": tl.VERSION, "thresholds": thresholds}


def run_id_of(config: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def check_pin(settings: Settings, run_id: str) -> None:
    """PinMismatch when `OCRFLEET_RUN_ID` is set to another run than `run_id`, this
    process's own."""
    pinned = settings.run_id
    if pinned is not None and pinned != run_id:
        raise PinMismatch(
            f"OCRFLEET_RUN_ID is {pinned}, but this process's settings and model files make "
            f"run {run_id} (`ocrfleet run-id` lists its parts): fix the settings or the pin"
        )


def ensure_run(session: Session, config: dict[str, Any]) -> str:
    """Record the run (idempotently) and return its id."""
    run_id = run_id_of(config)
    upsert(session, Run, {"id": run_id, "config": config}, key=["id"], update=[])
    return run_id


def registered(session: Session, run_id: str) -> dict[str, Any]:
    """The configuration of a registered run; RunConfigError naming the fix if there is
    none (a pin nobody registered: a typo, or no worker of it ever started)."""
    run = session.get(Run, run_id)
    if run is None:
        raise RunConfigError(
            f"run {run_id} (OCRFLEET_RUN_ID) is not registered: a worker of that run "
            "registers it when it starts, or `ocrfleet run-id --register` where its models are"
        )
    return run.config
