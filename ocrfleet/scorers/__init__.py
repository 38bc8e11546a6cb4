"""Scorers: the one the settings name (`consensus` on CPU, `jev` on GPU), and its
description for run_id, which needs no model loaded."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocrfleet.config import Settings

if TYPE_CHECKING:
    from ocrfleet.engines.base import Recogniser
    from ocrfleet.scorers.base import Policy, Scorer

SCORERS = ("consensus", "jev")


def _check_name(settings: Settings) -> None:
    if settings.scorer not in SCORERS:
        raise ValueError(
            f"unknown scorer {settings.scorer!r}: OCRFLEET_SCORER must be one of {SCORERS}"
        )


SECOND_READERS = ("rapidocr", "tesseract", "easyocr")


def _reader_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"engines": list(SECOND_READERS)})


def second_readers(settings: Settings, loaded: Sequence[Recogniser] = ()) -> list[Recogniser]:
    """The consensus scorer's independent re-readers, RapidOCR first, whatever engines
    produce the candidates: each candidate is re-read by every reader that is not its
    engine (EasyOCR last, and only where the others leave the decision open). Built by the
    engines' own loader, with the same settings; a reader among `loaded` (the process's
    engines) is shared, not loaded twice."""
    from ocrfleet.engines import load_recognisers

    have = {reader.name: reader for reader in loaded}
    missing = [name for name in SECOND_READERS if name not in have]
    if missing:
        fresh = load_recognisers(_reader_settings(settings).model_copy(update={"engines": missing}))
        have.update(zip(missing, fresh, strict=True))
    return [have[name] for name in SECOND_READERS]


def load_scorer(settings: Settings, loaded: Sequence[Recogniser] = ()) -> Scorer:
    """The configured scorer, models loaded (call once per process); `loaded`: recognisers
    the process has already, shared with the scorer."""
    if settings.scorer == "jev":
        from ocrfleet.scorers.jev import JevScorer

        return JevScorer(settings)
    from ocrfleet.scorers.consensus import ConsensusScorer

    return ConsensusScorer(settings, second_readers(settings, loaded))


def load_policy(settings: Settings) -> Policy:
    """The configured scorer's policy (thresholds, margin, its own rule); loads no model."""
    if settings.scorer == "jev":
        from ocrfleet.scorers.jev import policy
    else:
        from ocrfleet.scorers.consensus import policy
    return policy(settings)


def scorer_libraries(settings: Settings) -> set[str]:
    """The libraries the configured scorer uses: jev's model runs on torch and
    transformers (its renderer's libraries are in the renderer's version); the consensus
    scorer's are its re-readers'."""
    if settings.scorer == "jev":
        return {"torch", "transformers"}
    from ocrfleet.engines import engine_libraries

    return engine_libraries(_reader_settings(settings))


def describe_scorer(settings: Settings) -> dict[str, Any]:
    """Everything about the scorer that changes scores, without loading a model: the
    shared precheck's limits (a unit over one is `precheck_failed`, never scored) too."""
    precheck = {
        "min_side_px": settings.precheck_min_side_px,
        "max_text_chars": settings.precheck_max_text_chars,
    }
    if settings.scorer == "jev":
        from ocrfleet.scorers.render import renderer_version

        render_version = renderer_version(settings.render_font_path)
        return {
            "name": "jev",
            "renderer": render_version,
            "precheck": precheck,
            **_describe_jev(settings),
        }

    from ocrfleet.engines import describe_engines
    from ocrfleet.scorers.consensus import NAME, load_calibration, scorer_version, weights_path

    described = describe_engines(_reader_settings(settings))["recognisers"]
    readers = [(item["name"], item["version"]) for item in described]
    weights = load_calibration(weights_path(settings)).sha256
    return {
        "name": NAME,
        "version": scorer_version(weights, readers),
        "weights_sha256": weights,
        "second_readers": dict(readers),
        "precheck": precheck,
    }


def _describe_jev(settings: Settings) -> dict[str, Any]:
    """The checkpoint by content, not by where a pod mounts it: a missing folder is a
    CheckpointError here too, never a run without the model's hash."""
    from ocrfleet.checkpoints import checkpoint_folder
    from ocrfleet.scorers.jev import _prompt_sha256

    folder = checkpoint_folder(settings.jev_model_path, "OCRFLEET_JEV_MODEL_PATH")
    return {
        "model_sha256": _jev_folder_hash(folder),
        "prompt_sha256": _prompt_sha256()[:16],
        "dtype": settings.jev_dtype,
        "batch_size": settings.jev_batch_size,
        "attn_implementation": settings.jev_attn_implementation,
    }


@lru_cache(maxsize=4)
def _jev_folder_hash(path: Path) -> str:
    from ocrfleet.scorers.jev import _folder_sha256

    return _folder_sha256(path)[:16]
