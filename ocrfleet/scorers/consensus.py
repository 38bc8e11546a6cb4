"""The CPU consensus scorer: P(candidate text is exactly right) from cheap evidence.

Features (see `features.py`): the candidate engine's own confidence, agreement with an
independent second read of the same crop by another engine, the candidate rendered by the
frozen renderer and compared with the crop, and text shape. A logistic regression trained
by `bench/train_consensus.py` on synthetic lines combines them; its weights, the feature
names, the standardisation and the training data hash live in `consensus_weights.json`,
and the scorer's version is derived from that file's sha256 (plus the renderer's and the
second readers' versions), so a retrained calibration is a new run.

Verdicts: a unit that fails the shared precheck is `precheck_failed`; one the renderer
cannot draw is `render_failed`; a failure of the second read or of the feature computation
is `forward_failed` with the error; only a computed probability is `scored`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines.base import Recogniser
from ocrfleet.scorers.base import Unit, judgement
from ocrfleet.scorers.features import FEATURE_NAMES, Reading, unit_features
from ocrfleet.scorers.precheck import precheck
from ocrfleet.scorers.render import RenderError, content_bounds, render, renderer_version

NAME = "consensus"
WEIGHTS_PATH = Path(__file__).with_name("consensus_weights.json")
WEIGHTS_FORMAT = 1


# ---- calibration: the weights file -----------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """A fitted logistic regression over standardised features."""

    feature_names: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    coef: np.ndarray
    intercept: float
    sha256: str  # of the weights file: the calibration's identity

    def predict(self, features: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(features) - self.mean) / self.std @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-np.clip(z, -50.0, 50.0)))


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@lru_cache(maxsize=4)
def load_calibration(path: Path = WEIGHTS_PATH) -> Calibration:
    """Read and check a weights file; its features must be exactly this code's features."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"consensus weights {path} are missing; run `python bench/train_consensus.py`"
        )
    raw = json.loads(path.read_text(encoding="utf-8"))
    if raw.get("format") != WEIGHTS_FORMAT:
        raise ValueError(f"{path}: weights format {raw.get('format')!r}, expected {WEIGHTS_FORMAT}")
    names = tuple(raw["feature_names"])
    if names != FEATURE_NAMES:
        raise ValueError(
            f"{path} was trained on other features than this code computes; retrain with "
            f"bench/train_consensus.py (file: {len(names)} features, code: {len(FEATURE_NAMES)})"
        )
    std = np.array(raw["std"], dtype=np.float64)
    if np.any(std <= 0):
        raise ValueError(f"{path}: standard deviations must be positive")
    return Calibration(
        feature_names=names,
        mean=np.array(raw["mean"], dtype=np.float64),
        std=std,
        coef=np.array(raw["coef"], dtype=np.float64),
        intercept=float(raw["intercept"]),
        sha256=_file_sha256(path),
    )


def data_sha256(features: np.ndarray, labels: np.ndarray) -> str:
    """Hash of a training set (features rounded to 6 decimals, labels): the fit depends only
    on it, so the same hash gives the same weights file byte for byte."""
    rounded = np.round(np.asarray(features, dtype=np.float64), 6) + 0.0  # no negative zeros
    digest = hashlib.sha256()
    digest.update(json.dumps(list(FEATURE_NAMES)).encode())
    digest.update(np.ascontiguousarray(rounded, dtype="<f8").tobytes())
    digest.update(np.ascontiguousarray(np.asarray(labels, dtype=np.int8)).tobytes())
    return digest.hexdigest()


def fit_weights(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    l2: float = 1.0,
    iterations: int = 100,
    extra: dict[str, Any] | None = None,
) -> str:
    """Fit the logistic regression by Newton's method (IRLS) with an L2 penalty on the
    standardised coefficients, and return the weights file's text.

    Deterministic: no random initialisation, a fixed iteration rule, rounded output."""
    x = np.round(np.asarray(features, dtype=np.float64), 6)
    y = np.asarray(labels, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(FEATURE_NAMES) or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"features {x.shape} and labels {y.shape} do not fit {len(FEATURE_NAMES)} names"
        )
    if not (0 < y.sum() < len(y)):
        raise ValueError("training needs both correct and wrong examples")
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)
    z = np.hstack([np.ones((x.shape[0], 1)), (x - mean) / std])
    penalty = np.full(z.shape[1], l2)
    penalty[0] = 0.0  # the intercept is not shrunk
    beta = np.zeros(z.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ beta, -50.0, 50.0)))
        gradient = z.T @ (y - p) - penalty * beta
        hessian = (
            (z * (p * (1.0 - p))[:, None]).T @ z + np.diag(penalty) + 1e-9 * np.eye(z.shape[1])
        )
        step = np.linalg.solve(hessian, gradient)
        beta = beta + step
        if float(np.max(np.abs(step))) < 1e-10:
            break
    p = 1.0 / (1.0 + np.exp(-np.clip(z @ beta, -50.0, 50.0)))
    eps = 1e-12
    log_loss = float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps)))
    document = {
        "format": WEIGHTS_FORMAT,
        "model": "logistic regression on standardised features, L2, IRLS",
        "feature_names": list(FEATURE_NAMES),
        "mean": _rounded(mean),
        "std": _rounded(std),
        "coef": _rounded(beta[1:]),
        "intercept": round(float(beta[0]), 8),
        "l2": l2,
        "training": {
            "data_sha256": data_sha256(features, labels),
            "n": int(len(y)),
            "n_correct": int(y.sum()),
            "train_log_loss": round(log_loss, 6),
            **(extra or {}),
        },
    }
    return json.dumps(document, indent=1, sort_keys=False, ensure_ascii=True) + "\n"


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 8) + 0.0 for v in values]


# ---- the scorer -----------------------------------------------------------------------


def second_reader_for(engine: str, readers: Sequence[Recogniser]) -> Recogniser | None:
    """The first reader that is not the candidate's own engine: an independent read."""
    for reader in readers:
        if reader.name != engine:
            return reader
    return None


def scorer_version(
    weights_sha256: str, render_version: str, readers: Sequence[tuple[str, str]]
) -> str:
    """consensus calibration + renderer + second readers (name, version), all of which
    change the scores."""
    reader_part = ",".join(f"{name}@{version}" for name, version in readers)
    return f"{NAME}-{weights_sha256[:12]}+{render_version}+readers[{reader_part}]"


def _crop_key(crop: Image.Image) -> str:
    digest = hashlib.sha1(crop.tobytes(), usedforsecurity=False)
    digest.update(f"{crop.mode}{crop.size}".encode())
    return digest.hexdigest()


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class Failure:
    """Why a unit has no features: its verdict and the error."""

    verdict: ir.Verdict
    error: str


class ConsensusFeatures:
    """Everything the consensus scorer does before the regression: precheck, rendering,
    second reads and features. Training uses it directly, before any weights exist.

    `second_readers` give the independent read: for each unit the first reader whose name
    differs from the unit's engine reads its crop (RapidOCR for a tesseract candidate,
    tesseract for a RapidOCR one). All crops one reader needs in a batch are read in one
    call; when another unit of the batch already is that reader's reading of the same
    pixels, that reading is reused instead of reading again."""

    def __init__(self, settings: Settings, second_readers: Sequence[Recogniser]) -> None:
        if not second_readers:
            raise ValueError("the consensus scorer needs at least one second reader")
        self.settings = settings
        self.readers = list(second_readers)
        self.font_path = settings.render_font_path
        # Raises FontNotFoundError now, at start, rather than on the first unit.
        self.render_version = renderer_version(self.font_path)

    def compute(self, units: Sequence[Unit]) -> list[np.ndarray | Failure]:
        """A feature vector (FEATURE_NAMES order) or a Failure per unit, in order."""
        results: list[np.ndarray | Failure | None] = [None] * len(units)
        rendered: dict[int, tuple[Image.Image, tuple[int, int, int, int]]] = {}
        for i, unit in enumerate(units):
            try:
                reason = precheck(unit, self.settings)
            except Exception as error:  # noqa: BLE001 - an unreadable crop is this unit's verdict
                reason = _error_text(error)
            if reason is not None:
                results[i] = Failure(ir.Verdict.precheck_failed, reason)
                continue
            try:
                box = content_bounds(unit.crop)
                image = render(
                    unit.text, unit.category, unit.crop.size, box, font_path=self.font_path
                )
            except RenderError as error:
                results[i] = Failure(ir.Verdict.render_failed, str(error))
                continue
            except Exception as error:  # noqa: BLE001 - any renderer crash is this unit's verdict
                results[i] = Failure(ir.Verdict.render_failed, _error_text(error))
                continue
            rendered[i] = (image, box)

        seconds, read_errors = self._second_reads(units, list(rendered))
        for i, (image, box) in rendered.items():
            unit = units[i]
            if i in read_errors:
                results[i] = Failure(ir.Verdict.forward_failed, read_errors[i])
                continue
            try:
                results[i] = unit_features(
                    unit.crop,
                    unit.text,
                    unit.category,
                    unit.engine,
                    unit.confidence,
                    seconds.get(i),
                    image,
                    box,
                )
            except Exception as error:  # noqa: BLE001 - a feature failure is a verdict
                results[i] = Failure(ir.Verdict.forward_failed, _error_text(error))
        assert all(result is not None for result in results)
        return results  # type: ignore[return-value]

    def _second_reads(
        self, units: Sequence[Unit], wanted: list[int]
    ) -> tuple[dict[int, Reading], dict[int, str]]:
        """The second read for each wanted unit (None-reader units get none), and the
        read errors by unit index."""
        reader_names = {reader.name for reader in self.readers}
        wanted_set = set(wanted)
        keys = {
            i: _crop_key(unit.crop)
            for i, unit in enumerate(units)
            if i in wanted_set or unit.engine in reader_names
        }
        # Readings the batch already holds (even unscoreable ones, such as an empty read):
        # unit i is engine e's reading of the crop with key k.
        known: dict[tuple[str, str], Reading] = {}
        for i, unit in enumerate(units):
            if unit.engine in reader_names:
                known.setdefault(
                    (keys[i], unit.engine), Reading(unit.engine, unit.text, unit.confidence)
                )
        readings: dict[int, Reading] = {}
        errors: dict[int, str] = {}
        for reader in self.readers:
            needed = [
                i
                for i in wanted
                if (chosen := second_reader_for(units[i].engine, self.readers)) is not None
                and chosen is reader
            ]
            to_read: dict[str, Image.Image] = {}
            for i in needed:
                if (keys[i], reader.name) not in known:
                    to_read.setdefault(keys[i], units[i].crop)
            read_errors = self._read(reader, to_read, known)
            for i in needed:
                if keys[i] in read_errors:
                    errors[i] = f"second read by {reader.name} failed: {read_errors[keys[i]]}"
                else:
                    readings[i] = known[(keys[i], reader.name)]
        return readings, errors

    @staticmethod
    def _read(
        reader: Recogniser,
        crops: dict[str, Image.Image],
        known: dict[tuple[str, str], Reading],
    ) -> dict[str, str]:
        """Read all crops in one call; if that call fails, read them one by one so one bad
        crop does not fail the others. Returns the errors by crop key."""
        if not crops:
            return {}
        keys = list(crops)
        try:
            outputs = reader.recognise([crops[k] for k in keys])
            if len(outputs) != len(keys):
                raise RuntimeError(f"{len(outputs)} readings for {len(keys)} crops")
        except Exception:  # noqa: BLE001 - isolate the failing crop below
            outputs = None
        errors: dict[str, str] = {}
        for n, key in enumerate(keys):
            if outputs is not None:
                text, confidence = outputs[n]
            else:
                try:
                    ((text, confidence),) = reader.recognise([crops[key]])
                except Exception as error:  # noqa: BLE001 - this crop's verdict
                    errors[key] = _error_text(error)
                    continue
            known[(key, reader.name)] = Reading(reader.name, text, confidence)
        return errors


class ConsensusScorer:
    """Scores units by calibrated agreement, render-and-compare and text evidence."""

    name = NAME

    def __init__(
        self,
        settings: Settings,
        second_readers: Sequence[Recogniser],
        weights_path: Path = WEIGHTS_PATH,
    ) -> None:
        self.features = ConsensusFeatures(settings, second_readers)
        self.calibration = load_calibration(Path(weights_path))
        self.version = scorer_version(
            self.calibration.sha256,
            self.features.render_version,
            [(r.name, r.version) for r in self.features.readers],
        )

    def score(self, units: list[Unit]) -> list[ir.Score]:
        computed = self.features.compute(units)
        rows = [i for i, value in enumerate(computed) if isinstance(value, np.ndarray)]
        probabilities: dict[int, float] = {}
        if rows:
            predicted = self.calibration.predict(np.vstack([computed[i] for i in rows]))
            probabilities = {i: float(p) for i, p in zip(rows, predicted, strict=True)}
        scores = []
        for i, (unit, value) in enumerate(zip(units, computed, strict=True)):
            if isinstance(value, Failure):
                scores.append(judgement(self, unit, value.verdict, error=value.error))
            elif math.isfinite(probabilities[i]):
                scores.append(judgement(self, unit, ir.Verdict.scored, score=probabilities[i]))
            else:
                scores.append(
                    judgement(
                        self,
                        unit,
                        ir.Verdict.forward_failed,
                        error=f"non-finite score {probabilities[i]}",
                    )
                )
        return scores
