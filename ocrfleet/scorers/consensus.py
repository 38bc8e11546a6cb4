"""The CPU consensus scorer: P(candidate text is usable as is) from cheap evidence.

Features (see `features.py`): the candidate engine's own confidence (or the fact it has
none), agreement with independent re-reads of the same crop by RapidOCR and tesseract, and
text shape.
Gradient-boosted trees fitted by `bench/train_consensus.py` on real engine output (receipts,
book lines, UNLV zones; labels by `ocrfleet.labels`) combine them, and a Platt map fitted on
held-back documents turns their log-odds into a probability. The weights file holds the
trees, the map, the thresholds chosen on held-back data per (engine, category), the
validated best-of-N margin, the training data hashes and the cross-validation numbers; the
scorer's version is derived from that file's sha256 (plus the re-readers' versions), so a
refit is a new run.

Verdicts: a unit that fails the shared precheck is `precheck_failed`; a failure of a
re-read or of the feature computation is `forward_failed` with the error; only a computed
probability is `scored`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines.base import Recogniser
from ocrfleet.scorers.base import Policy, Unit, judgement, settings_thresholds
from ocrfleet.scorers.features import (
    FEATURE_NAMES,
    Reading,
    least_word_confidence,
    optimistic,
    rereads_for,
    unit_features,
)
from ocrfleet.scorers.model import Platt, Trees
from ocrfleet.scorers.precheck import precheck

NAME = "consensus"
WEIGHTS_PATH = Path(__file__).with_name("consensus_weights.json")
WEIGHTS_FORMAT = 3


# ---- calibration: the weights file -----------------------------------------------------

OTHER_ENGINE = "other"  # thresholds for any engine the fit saw no candidates of


@dataclass(frozen=True)
class Calibration:
    """The fitted trees, their calibration, and what was chosen on held-back data."""

    feature_names: tuple[str, ...]
    trees: Trees
    calibration: Platt
    # engine ("rapidocr", "tesseract", OTHER_ENGINE) -> category -> threshold; None where
    # no threshold reached the precision target (that kind goes to review: `uncalibrated`).
    thresholds: dict[str, dict[str, float | None]]
    margin: float  # best-of-N: another engine's candidate must beat the primary by more
    # Before the re-reads: trees over the features a candidate has without them, whose
    # log-odds under the cut for its engine predict it will not be accepted (see
    # ConsensusScorer.score_against); no cut: that engine's candidates are not screened.
    screen: Trees
    screen_cuts: dict[str, float | None]
    sha256: str  # of the weights file: the calibration's identity

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.calibration(self.trees.raw(features))

    def threshold(self, engine: str, category: str) -> float | None:
        by_category = self.thresholds.get(engine, self.thresholds.get(OTHER_ENGINE, {}))
        return by_category.get(str(category))

    def screen_cut(self, engine: str) -> float:
        """The screen's cut for `engine`'s candidates; -inf screens none out."""
        cut = self.screen_cuts.get(engine, self.screen_cuts.get(OTHER_ENGINE))
        return -math.inf if cut is None else cut


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
    trees = Trees.from_json(raw["trees"])
    screen = Trees.from_json(raw["screen"]["trees"])
    for fitted in (trees, screen):
        if fitted.feature.size and int(fitted.feature.max()) >= len(names):
            raise ValueError(f"{path}: a tree splits on a feature this code does not compute")
    return Calibration(
        feature_names=names,
        trees=trees,
        calibration=Platt.from_json(raw["calibration"]),
        thresholds={
            engine: {c: (None if t is None else float(t)) for c, t in by_category.items()}
            for engine, by_category in raw["thresholds"].items()
        },
        margin=float(raw["best_of_n_margin"]),
        screen=screen,
        screen_cuts={
            engine: None if cut is None else float(cut)
            for engine, cut in raw["screen"]["cuts"].items()
        },
        sha256=_file_sha256(path),
    )


# ---- the scorer -----------------------------------------------------------------------


def policy(settings: Settings) -> Policy:
    """The settings' thresholds where set; the calibration's per (engine, category)
    thresholds and best-of-N margin otherwise."""
    calibration = load_calibration(WEIGHTS_PATH)
    return Policy(
        fixed=settings_thresholds(settings),
        per_engine=calibration.thresholds,
        margin=calibration.margin,
    )


def scorer_version(weights_sha256: str, readers: Sequence[tuple[str, str]]) -> str:
    """consensus calibration + re-readers (name, version), both of which change the scores."""
    reader_part = ",".join(f"{name}@{version}" for name, version in readers)
    return f"{NAME}-{weights_sha256[:12]}+readers[{reader_part}]"


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


def read_with_words(reader: Recogniser, crops: list[Image.Image]) -> list[Reading]:
    """`reader`'s readings of `crops`, with the least word confidence where it gives words."""
    with_words = getattr(reader, "recognise_words", None)
    if with_words is None:
        return [Reading(reader.name, text, conf) for text, conf in reader.recognise(crops)]
    return [
        Reading(reader.name, text, conf, least_word_confidence(words))
        for text, conf, words in with_words(crops)
    ]


class ConsensusFeatures:
    """Everything the consensus scorer does before the model: precheck, re-reads and
    features. Training uses it directly, before any weights exist.

    `readers` give the independent re-reads: every reader whose name differs from the unit's
    engine reads its crop (tesseract for a RapidOCR candidate, RapidOCR for a tesseract one,
    both for any other engine's). All crops one reader needs in a batch are read in one
    call; when another unit of the batch already is that reader's reading of the same
    pixels, that reading is reused instead of reading again."""

    def __init__(self, settings: Settings, readers: Sequence[Recogniser]) -> None:
        if not readers:
            raise ValueError("the consensus scorer needs at least one re-reader")
        self.settings = settings
        self.readers = list(readers)

    def compute(
        self, units: Sequence[Unit], rereads: Sequence[dict[str, Reading]] | None = None
    ) -> list[np.ndarray | Failure]:
        """A feature vector (FEATURE_NAMES order) or a Failure per unit, in order.

        `rereads` (training: readings already cached) stands in for reading the crops."""
        results: list[np.ndarray | Failure | None] = [None] * len(units)
        passed = []
        for i, unit in enumerate(units):
            failure = self._precheck(unit)
            if failure is None:
                passed.append(i)
            else:
                results[i] = failure
        if rereads is None:
            found, read_errors = self._rereads(units, passed)
        else:
            found, read_errors = dict(enumerate(rereads)), {}
        for i in passed:
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
                    found.get(i, {}),
                    unit.word_confidence,
                )
            except Exception as error:  # noqa: BLE001 - a feature failure is a verdict
                results[i] = Failure(ir.Verdict.forward_failed, _error_text(error))
        assert all(result is not None for result in results)
        return results  # type: ignore[return-value]

    def _precheck(self, unit: Unit) -> Failure | None:
        try:
            reason = precheck(unit, self.settings)
        except Exception as error:  # noqa: BLE001 - an unreadable crop is this unit's verdict
            reason = _error_text(error)
        return None if reason is None else Failure(ir.Verdict.precheck_failed, reason)

    def _rereads(
        self, units: Sequence[Unit], wanted: list[int]
    ) -> tuple[dict[int, dict[str, Reading]], dict[int, str]]:
        """The independent re-reads of each wanted unit by reader name, and the read errors
        by unit index."""
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
                    (keys[i], unit.engine),
                    Reading(unit.engine, unit.text, unit.confidence, unit.word_confidence),
                )
        readings: dict[int, dict[str, Reading]] = {i: {} for i in wanted}
        errors: dict[int, str] = {}
        for reader in self.readers:
            needed = [i for i in wanted if reader.name in rereads_for(units[i].engine)]
            to_read: dict[str, Image.Image] = {}
            for i in needed:
                if (keys[i], reader.name) not in known:
                    to_read.setdefault(keys[i], units[i].crop)
            read_errors = self._read(reader, to_read, known)
            for i in needed:
                if keys[i] in read_errors:
                    errors.setdefault(i, f"re-read by {reader.name} failed: {read_errors[keys[i]]}")
                else:
                    readings[i][reader.name] = known[(keys[i], reader.name)]
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
            outputs = read_with_words(reader, [crops[k] for k in keys])
            if len(outputs) != len(keys):
                raise RuntimeError(f"{len(outputs)} readings for {len(keys)} crops")
        except Exception:  # noqa: BLE001 - isolate the failing crop below
            outputs = None
        errors: dict[str, str] = {}
        for n, key in enumerate(keys):
            if outputs is not None:
                reading = outputs[n]
            else:
                try:
                    (reading,) = read_with_words(reader, [crops[key]])
                except Exception as error:  # noqa: BLE001 - this crop's verdict
                    errors[key] = _error_text(error)
                    continue
            known[(key, reader.name)] = reading
        return errors


class ConsensusScorer:
    """Scores units by calibrated confidence, agreement and text evidence."""

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
            self.calibration.sha256, [(r.name, r.version) for r in self.features.readers]
        )

    def score_against(
        self, units: list[Unit], threshold: Callable[[Unit], float | None]
    ) -> list[ir.Score]:
        """`score`, without the re-reads that will not change a decision. A unit that is
        its region's only candidate is not re-read when its threshold (`threshold(unit)`)
        is out of reach or there is none, or when the screen predicts it will not be
        accepted; its verdict is then `bounded`, its score the best any re-read could give
        it (every re-read agreeing, `features.optimistic`), and the region goes to review.
        Out of reach is exact: that bound is under the threshold. The screen is fitted: on
        held-back real rows it screens out at most 1% of the candidates that would have
        been accepted (the weights file records how many, per set). The re-reads were most
        of the scorer's time, and on real pages most of them are of units like these."""
        first = self.features.compute(units, [{} for _ in units])
        per_region = Counter(unit.region_number for unit in units)
        sole = [
            i
            for i, value in enumerate(first)
            if isinstance(value, np.ndarray) and per_region[units[i].region_number] == 1
        ]
        bounds: dict[int, float] = {}
        if sole:
            rows, free = zip(*(optimistic(first[i], units[i].engine) for i in sole), strict=True)
            calibration = self.calibration
            upper = calibration.calibration(
                calibration.trees.upper_raw(np.vstack(rows), np.vstack(free))
            )
            odds = calibration.screen.raw(np.vstack([first[i] for i in sole]))
            for i, bound, screen in zip(sole, upper, odds, strict=True):
                limit = threshold(units[i])
                screened = screen < calibration.screen_cut(units[i].engine)
                if math.isfinite(bound) and (limit is None or bound < limit or screened):
                    bounds[i] = float(bound)
        rest = [
            i for i, value in enumerate(first) if i not in bounds and isinstance(value, np.ndarray)
        ]
        exact = dict(zip(rest, self.score([units[i] for i in rest]), strict=True))
        scores = []
        for i, (unit, value) in enumerate(zip(units, first, strict=True)):
            if i in exact:
                scores.append(exact[i])
            elif i in bounds:
                scores.append(judgement(self, unit, ir.Verdict.bounded, score=bounds[i]))
            else:
                assert isinstance(value, Failure)
                scores.append(judgement(self, unit, value.verdict, error=value.error))
        return scores

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
