"""The CPU consensus scorer: P(candidate text is usable as is) from cheap evidence.

Features (see `features.py`): the candidate engine's own confidence (or the fact it has
none), agreement with independent re-reads of the same crop by RapidOCR, tesseract and
EasyOCR, the CTC models' character evidence and cross-scores, and text shape.
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
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines.base import Recogniser
from ocrfleet.errors import ConfigError
from ocrfleet.scorers.base import Policy, Unit, judgement, settings_thresholds
from ocrfleet.scorers.features import (
    FEATURE_NAMES,
    CtcScores,
    Reading,
    ctc_scores,
    least_word_confidence,
    optimistic,
    pessimistic,
    rereads_for,
    unit_features,
)
from ocrfleet.scorers.model import Platt, Trees
from ocrfleet.scorers.precheck import precheck

NAME = "consensus"
WEIGHTS_PATH = Path(__file__).with_name("consensus_weights.json")
WEIGHTS_FORMAT = 6


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
    # After every re-read but the LAZY_READERS': trees over the features a candidate has
    # then, their own Platt map, and per engine the threshold at or over which it is
    # accepted without the lazy readers, and the cut on the log-odds under which it goes to
    # review without them (see ConsensusScorer.score_against).
    second: Trees
    second_calibration: Platt
    second_thresholds: dict[str, float | None]
    second_cuts: dict[str, float | None]
    # Before any re-read: trees over the same features as the screen's, their own Platt map,
    # and per engine the threshold at or over which a candidate is accepted unread (see
    # ConsensusScorer.score_against).
    early: Trees
    early_calibration: Platt
    early_thresholds: dict[str, float | None]
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

    def second_stage(self, engine: str) -> tuple[float, float]:
        """(threshold, cut) of the second stage for `engine`'s candidates: inf accepts
        none early, -inf sends none to review early."""
        threshold = self.second_thresholds.get(engine, self.second_thresholds.get(OTHER_ENGINE))
        cut = self.second_cuts.get(engine, self.second_cuts.get(OTHER_ENGINE))
        return (
            math.inf if threshold is None else threshold,
            -math.inf if cut is None else cut,
        )

    def early_threshold(self, engine: str) -> float:
        """The early accept's threshold for `engine`'s candidates; inf accepts none."""
        threshold = self.early_thresholds.get(engine, self.early_thresholds.get(OTHER_ENGINE))
        return math.inf if threshold is None else threshold


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weights_path(settings: Settings) -> Path:
    """The weights file the settings name (OCRFLEET_CONSENSUS_WEIGHTS_PATH), else the shipped
    one: a fleet rolls out a refit without a release, and a bench scores with weights fitted
    without its documents."""
    if settings.consensus_weights_path is None:
        return WEIGHTS_PATH
    path = Path(settings.consensus_weights_path)
    if not path.is_file():
        raise ConfigError(f"OCRFLEET_CONSENSUS_WEIGHTS_PATH is not a file: {path}")
    return path


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
    second = Trees.from_json(raw["second"]["trees"])
    early = Trees.from_json(raw["early"]["trees"])
    for fitted in (trees, screen, second, early):
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
        second=second,
        second_calibration=Platt.from_json(raw["second"]["calibration"]),
        second_thresholds={
            engine: None if t is None else float(t)
            for engine, t in raw["second"]["thresholds"].items()
        },
        second_cuts={
            engine: None if cut is None else float(cut)
            for engine, cut in raw["second"]["cuts"].items()
        },
        early=early,
        early_calibration=Platt.from_json(raw["early"]["calibration"]),
        early_thresholds={
            engine: None if t is None else float(t)
            for engine, t in raw["early"]["thresholds"].items()
        },
        sha256=_file_sha256(path),
    )


# ---- the scorer -----------------------------------------------------------------------


def policy(settings: Settings) -> Policy:
    """The settings' thresholds where set; the calibration's per (engine, category)
    thresholds and best-of-N margin otherwise."""
    calibration = load_calibration(weights_path(settings))
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


# Readers asked last, and only where the others' evidence leaves the decision open: where
# their reading cannot lift the unit's best possible score to its threshold, nor sink its
# worst under it, or where the fitted second stage decides without them, they are not
# asked (see ConsensusScorer.score_against).
LAZY_READERS = ("easyocr",)


@dataclass
class _Known:
    """What one batch has read so far, by (crop key, reader): readings, CTC scores and
    read errors; later stages reuse it instead of reading again."""

    readings: dict[tuple[str, str], Reading] = field(default_factory=dict)
    ctc: dict[tuple[str, str], CtcScores] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)


def _is_ctc(reader: Recogniser) -> bool:
    return callable(getattr(reader, "posteriors", None))


class ConsensusFeatures:
    """Everything the consensus scorer does before the model: precheck, re-reads and
    features. Training uses it directly, before any weights exist.

    `readers` give the independent re-reads: every reader whose name differs from the unit's
    engine reads its crop (tesseract and EasyOCR for a RapidOCR candidate, and so on; all
    of them for any other engine's). A CTC reader (one with `posteriors`) reads through its
    posterior matrix, which gives its reading, its character evidence and the
    cross-scores in one model call. All crops one reader needs in a batch are read in one
    call; when another unit of the batch already is that (non-CTC) reader's reading of the
    same pixels, that reading is reused instead of reading again."""

    def __init__(self, settings: Settings, readers: Sequence[Recogniser]) -> None:
        if not readers:
            raise ValueError("the consensus scorer needs at least one re-reader")
        self.settings = settings
        self.readers = list(readers)

    def compute(
        self,
        units: Sequence[Unit],
        rereads: Sequence[dict[str, Reading]] | None = None,
        ctc: Sequence[dict[str, CtcScores]] | None = None,
        *,
        readers: Collection[str] | None = None,
        known: _Known | None = None,
    ) -> list[np.ndarray | Failure]:
        """A feature vector (FEATURE_NAMES order) or a Failure per unit, in order.

        `rereads` and `ctc` (training: values already cached) stand in for reading the
        crops; otherwise the readers named in `readers` (default: all) read them, reusing
        and adding to `known`."""
        results: list[np.ndarray | Failure | None] = [None] * len(units)
        passed = []
        for i, unit in enumerate(units):
            failure = self._precheck(unit)
            if failure is None:
                passed.append(i)
            else:
                results[i] = failure
        if rereads is None:
            names = {r.name for r in self.readers} if readers is None else set(readers)
            found, evidence, read_errors = self._rereads(
                units, passed, names, _Known() if known is None else known
            )
        else:
            found, read_errors = dict(enumerate(rereads)), {}
            evidence = dict(enumerate(ctc)) if ctc is not None else {}
        for i in passed:
            unit = units[i]
            if i in read_errors:
                results[i] = Failure(ir.Verdict.forward_failed, read_errors[i])
                continue
            try:
                results[i] = unit_features(
                    unit.text,
                    unit.category,
                    unit.engine,
                    unit.confidence,
                    found.get(i, {}),
                    unit.word_confidence,
                    evidence.get(i, {}),
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
        self, units: Sequence[Unit], wanted: list[int], names: set[str], known: _Known
    ) -> tuple[dict[int, dict[str, Reading]], dict[int, dict[str, CtcScores]], dict[int, str]]:
        """The independent re-reads of each wanted unit by reader name (only readers in
        `names`), the CTC scores among them, and the read errors by unit index."""
        plain = {reader.name for reader in self.readers if not _is_ctc(reader)}
        wanted_set = set(wanted)
        keys = {
            i: _crop_key(unit.crop)
            for i, unit in enumerate(units)
            if i in wanted_set or unit.engine in plain
        }
        # Readings the batch already holds (even unscoreable ones, such as an empty read):
        # unit i is engine e's reading of the crop with key k. A CTC reader reads anyway,
        # for its posterior.
        for i, unit in enumerate(units):
            if unit.engine in plain:
                known.readings.setdefault(
                    (keys[i], unit.engine),
                    Reading(unit.engine, unit.text, unit.confidence, unit.word_confidence),
                )
        readings: dict[int, dict[str, Reading]] = {i: {} for i in wanted}
        evidence: dict[int, dict[str, CtcScores]] = {i: {} for i in wanted}
        errors: dict[int, str] = {}
        for reader in self.readers:
            # a CTC model also gives its evidence on its own engine's candidates, always
            # (the engine's recognition pass left the posterior in ctc.RECENT)
            own = [i for i in wanted if _is_ctc(reader) and units[i].engine == reader.name]
            needed = [
                i
                for i in wanted
                if reader.name in names and reader.name in rereads_for(units[i].engine)
            ]
            to_read: dict[str, Image.Image] = {}
            for i in own + needed:
                key = (keys[i], reader.name)
                if key not in known.readings and key not in known.errors:
                    to_read.setdefault(keys[i], units[i].crop)
            self._read(reader, to_read, known)
            for i in own + needed:
                key = (keys[i], reader.name)
                if key in known.errors:
                    errors.setdefault(i, f"re-read by {reader.name} failed: {known.errors[key]}")
                    continue
                if i in needed:
                    readings[i][reader.name] = known.readings[key]
                if key in known.ctc:
                    evidence[i][reader.name] = known.ctc[key]
        return readings, evidence, errors

    @staticmethod
    def _read(reader: Recogniser, crops: dict[str, Image.Image], known: _Known) -> None:
        """Read all crops in one call; if that call fails, read them one by one so one bad
        crop does not fail the others. Adds readings (and CTC scores) or errors to `known`."""
        if not crops:
            return
        keys = list(crops)

        def read(images: list[Image.Image]) -> list[tuple[Reading, CtcScores | None]]:
            if _is_ctc(reader):
                scores = [ctc_scores(p) for p in reader.posteriors(images)]  # type: ignore[attr-defined]
                return [(s.reading(), s) for s in scores]
            return [(r, None) for r in read_with_words(reader, images)]

        try:
            outputs = read([crops[k] for k in keys])
            if len(outputs) != len(keys):
                raise RuntimeError(f"{len(outputs)} readings for {len(keys)} crops")
        except Exception:  # noqa: BLE001 - isolate the failing crop below
            outputs = None
        for n, key in enumerate(keys):
            if outputs is not None:
                reading, scores = outputs[n]
            else:
                try:
                    ((reading, scores),) = read([crops[key]])
                except Exception as error:  # noqa: BLE001 - this crop's verdict
                    known.errors[(key, reader.name)] = _error_text(error)
                    continue
            known.readings[(key, reader.name)] = reading
            if scores is not None:
                known.ctc[(key, reader.name)] = scores


class ConsensusScorer:
    """Scores units by calibrated confidence, agreement and text evidence."""

    name = NAME

    def __init__(
        self,
        settings: Settings,
        second_readers: Sequence[Recogniser],
        weights: Path | None = None,
    ) -> None:
        self.features = ConsensusFeatures(settings, second_readers)
        self.calibration = load_calibration(Path(weights or weights_path(settings)))
        self.version = scorer_version(
            self.calibration.sha256, [(r.name, r.version) for r in self.features.readers]
        )

    def score_against(
        self, units: list[Unit], threshold: Callable[[Unit], float | None]
    ) -> list[ir.Score]:
        """`score`, without the re-reads that will not change a decision. For a unit that is
        its region's only candidate, in stages:

        1. before any re-read: the fitted early accept (a model of the features the unit
           has before any re-read, with its own Platt map and thresholds, chosen so that
           the whole path keeps the full model's promise on held-back rows) predicts it is
           right; at or over both its own threshold and the unit's, the unit is `scored` at
           that probability, read by no one else. Otherwise it is not re-read when its
           threshold (`threshold(unit)`) is out of reach or there is none, or when the
           screen predicts it will not be accepted; its verdict is then `bounded`, its
           score the best any re-read could give it (every re-read agreeing,
           `features.optimistic`), and the region goes to review. Out of reach is exact:
           that bound is under the threshold. The screen is fitted: on held-back real rows
           it screens out at most 1% of the candidates that would have been accepted (the
           weights file records how many, per set).
        2. after the other re-reads, the `LAZY_READERS` are asked only where their reading
           could change the decision: where even their full agreement leaves the unit
           under its threshold it is `bounded` at that best score; where even their full
           disagreement leaves it at or over the threshold it is `scored` at that least
           score (a lower bound on the exact score, so accepted exactly when the exact
           score would accept it). Then the fitted second stage: a model of the features
           the unit has now predicts it is right; at or over both its own threshold
           (chosen, as the full model's, for precision >= 0.99 with its bound on held-back
           rows) and the unit's, the unit is `scored` at that probability, unread by the
           lazy readers; with log-odds under its cut (under which no held-back candidate
           the full model accepted fell) it is `bounded` at its best score.
        Regions with several candidates are always read by every reader (best-of-N compares
        exact scores)."""
        known = _Known()
        first = self.features.compute(units, readers=(), known=known)
        per_region = Counter(unit.region_number for unit in units)
        limits = [threshold(unit) for unit in units]
        sole = [
            i
            for i, value in enumerate(first)
            if isinstance(value, np.ndarray) and per_region[units[i].region_number] == 1
        ]
        decided: dict[int, ir.Score] = {}
        if sole:
            rows, free = zip(*(optimistic(first[i], units[i].engine) for i in sole), strict=True)
            calibration = self.calibration
            upper = calibration.calibration(
                calibration.trees.upper_raw(np.vstack(rows), np.vstack(free))
            )
            unread = np.vstack([first[i] for i in sole])
            odds = calibration.screen.raw(unread)
            right = calibration.early_calibration(calibration.early.raw(unread))
            for i, bound, screen, early in zip(sole, upper, odds, right, strict=True):
                limit = limits[i]
                if limit is not None and early >= max(
                    calibration.early_threshold(units[i].engine), limit
                ):
                    decided[i] = self._judge(units[i], ir.Verdict.scored, float(early))
                    continue
                screened = screen < calibration.screen_cut(units[i].engine)
                if math.isfinite(bound) and (limit is None or bound < limit or screened):
                    decided[i] = self._judge(units[i], ir.Verdict.bounded, float(bound))
        for i, value in enumerate(first):
            if isinstance(value, Failure):
                decided[i] = judgement(self, units[i], value.verdict, error=value.error)
        lazy = {r.name for r in self.features.readers if r.name in LAZY_READERS}
        if lazy:
            decided.update(self._without(units, limits, decided, per_region, lazy, known))
        rest = [i for i in range(len(units)) if i not in decided]
        exact = dict(zip(rest, self.score([units[i] for i in rest], known), strict=True))
        return [decided[i] if i in decided else exact[i] for i in range(len(units))]

    def _without(
        self,
        units: list[Unit],
        limits: list[float | None],
        decided: dict[int, ir.Score],
        per_region: Counter,
        lazy: set[str],
        known: _Known,
    ) -> dict[int, ir.Score]:
        """Stage 2 of `score_against`: the units the other readers' evidence decides."""
        open_ = [i for i in range(len(units)) if i not in decided]
        eager = {r.name for r in self.features.readers} - lazy
        computed = self.features.compute([units[i] for i in open_], readers=eager, known=known)
        calibration = self.calibration
        trees, platt = calibration.trees, calibration.calibration
        out: dict[int, ir.Score] = {}
        for i, value in zip(open_, computed, strict=True):
            if isinstance(value, Failure):
                out[i] = judgement(self, units[i], value.verdict, error=value.error)
                continue
            engine = units[i].engine
            pending = [name for name in rereads_for(engine) if name in lazy]
            limit = limits[i]
            if per_region[units[i].region_number] != 1 or not pending or limit is None:
                continue
            row, free = optimistic(value, engine, pending)
            upper = float(platt(trees.upper_raw(row[None], free[None]))[0])
            row, free = pessimistic(value, engine, pending)
            lower = float(platt(trees.lower_raw(row[None], free[None]))[0])
            if upper < limit:
                out[i] = self._judge(units[i], ir.Verdict.bounded, upper)
                continue
            if lower >= limit:
                out[i] = self._judge(units[i], ir.Verdict.scored, lower)
                continue
            early, cut = calibration.second_stage(engine)
            raw = calibration.second.raw(value[None])
            predicted = float(calibration.second_calibration(raw)[0])
            if predicted >= max(early, limit):
                out[i] = self._judge(units[i], ir.Verdict.scored, predicted)
            elif float(raw[0]) < cut:
                out[i] = self._judge(units[i], ir.Verdict.bounded, upper)
        return out

    def _judge(self, unit: Unit, verdict: ir.Verdict, score: float) -> ir.Score:
        if not math.isfinite(score):
            return judgement(
                self, unit, ir.Verdict.forward_failed, error=f"non-finite score {score}"
            )
        return judgement(self, unit, verdict, score=score)

    def score(self, units: list[Unit], known: _Known | None = None) -> list[ir.Score]:
        """Every unit read by every reader that is not its engine, then scored."""
        computed = self.features.compute(units, known=known)
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
