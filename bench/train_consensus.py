"""Fit the consensus scorer on real engine output: `python bench/train_consensus.py`.

Data: the rows of bench/realrows.py (SROIE receipts, UW3 book lines, UNLV zones, the lines
of Debian's PDF manuals' text layers; every crop read by RapidOCR, tesseract and EasyOCR,
with the CTC models' evidence, cached). Each engine's reading is a candidate, its
independent re-reads the other engines' readings of the same crop (a CTC model's through its
posterior, as the scorer reads), its character evidence and cross-scores those of the CTC
models that are not its engine; the label is `ocrfleet.labels.same_text` against the audited
truth (bench/label_audit.py; case-insensitive for SROIE, whose transcripts are often
upper-cased). Augmentation, never the base: candidates of an engine without confidence (the
way MiniCPM-OCR's look), re-read by every engine: for a receipt's detected region, the
engines' readings of the matching ground-truth box (real errors on a slightly different
crop), and for book lines, zones and text-layer lines the truth and one rule perturbation of
it (the text layer's candidates, `pdf-text`, have no confidence either).

Procedure (fixed seeds throughout, so the same rows give the same file byte for byte):
1. documents go to 5 folds by a hash of their id (grouped: a receipt or page is never
   both fitted and predicted);
2. out-of-fold log-odds for every candidate from a HistGradientBoostingClassifier with
   monotone constraints (`features.INCREASING`) fitted on the other folds;
3. the Platt map is fitted on those held-back predictions; thresholds per (engine,
   category) are the lowest whose Clopper-Pearson 95% lower bound on precision is >= 0.99
   on them, raised where a set's point precision would fall below 0.99; the best-of-N
   margin is the smallest that never makes a set's CER worse than the best single
   engine's, or, where none is, the one whose worst set is least above it;
4. the screen: a second model, fitted on the features a candidate has before its re-reads
   (its own confidences, its text, its crop), predicts whether the candidate will end
   accepted (out-of-fold score at its threshold); its cut is the highest that sends at
   most SCREEN_LOSS of any set's accepted candidates to review (out-of-fold). The scorer
   re-reads none of what it screens out, which on real pages is most of the re-reads;
5. the second stage: a third model, fitted on the features a candidate has after every
   re-read but the lazy readers' (`consensus.LAZY_READERS`: EasyOCR), predicts whether it
   is right; its Platt map and thresholds are chosen as the full model's (step 3). Where
   its probability reaches that threshold (and the full one), the candidate is accepted
   without the lazy readers; where its log-odds are under the cut (the least of any
   candidate the full model accepts, out-of-fold: SCREEN_LOSS) it goes to review unread by
   them. The evidence is the whole path's, out-of-fold: accepted, precision and its bound;
6. the early accept: a fourth model, fitted on the features a candidate has before any
   re-read (as the screen's), predicts whether it is right, with its own Platt map; where
   its probability reaches its threshold (and the full one) the candidate is accepted
   unread by anyone. The threshold is raised until the whole path (early accepts, then
   step 5's) keeps the promise per engine group and set;
7. the shipped trees (all four) are fitted on all rows.
The weights file records the data hashes, the cross-validation AUROCs and every choice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# One OpenMP thread: on a shared machine scikit-learn's spinning OpenMP threads make the fit
# many times slower; with one thread the fit is also trivially the same run to run.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.realrows import OUT, SETS, RealRow, load_rows  # noqa: E402
from bench.synthetic import perturb  # noqa: E402
from ocrfleet import ir  # noqa: E402
from ocrfleet.labels import same_text  # noqa: E402
from ocrfleet.metrics import levenshtein  # noqa: E402
from ocrfleet.scorers.base import Unit  # noqa: E402
from ocrfleet.scorers.consensus import (  # noqa: E402
    LAZY_READERS,
    OTHER_ENGINE,
    WEIGHTS_FORMAT,
    WEIGHTS_PATH,
)
from ocrfleet.scorers.features import (  # noqa: E402
    DECREASING,
    FEATURE_NAMES,
    INCREASING,
    READERS,
    CtcScores,
    Reading,
)
from ocrfleet.thresholds import choose_threshold  # noqa: E402

ENGINES = READERS  # the engines that produced the candidates, in primary order
AUGMENTED = "augmented"  # the engine name of confidence-less candidates
N_FOLDS = 5
SEED = 0
PRECISION = 0.99
CATEGORIES = ("text", "formula", "table")
HGB_PARAMS = {
    "learning_rate": 0.06,
    "max_iter": 250,
    "max_leaf_nodes": 15,
    "min_samples_leaf": 40,
    "l2_regularization": 1.0,
    "early_stopping": False,
    "random_state": SEED,
}
MARGINS = tuple(round(m, 3) for m in np.arange(0.0, 1.0001, 0.02))
# The share of a set's accepted candidates the screen may send to review unread: reviewer
# time, never precision (a screened candidate is not accepted).
SCREEN_LOSS = 0.0


@dataclass
class Examples:
    """Candidates with their cached re-reads, labels and groups, in a fixed order."""

    units: list[Unit] = field(default_factory=list)
    rereads: list[dict[str, Reading]] = field(default_factory=list)
    ctc: list[dict[str, CtcScores]] = field(default_factory=list)
    labels: list[bool] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    docs: list[str] = field(default_factory=list)  # "<set>/<doc>"
    rows: list[str] = field(default_factory=list)  # the row id: candidates of one crop
    truths: list[str] = field(default_factory=list)
    case_sensitive: list[bool] = field(default_factory=list)

    def add(
        self,
        row: RealRow,
        unit: Unit,
        rereads: dict[str, Reading],
        ctc: dict[str, CtcScores],
        label: bool,
    ) -> None:
        self.units.append(unit)
        self.rereads.append(rereads)
        self.ctc.append(ctc)
        self.labels.append(label)
        self.sets.append(row.set)
        self.docs.append(f"{row.set}/{row.doc}")
        self.rows.append(f"{row.set}/{row.id}")
        self.truths.append(row.truth)
        self.case_sensitive.append(row.case_sensitive)


def _reading(row: RealRow, engine: str) -> Reading | None:
    value = row.reads.get(engine)
    return None if value is None else Reading(engine, *value)


def partner_of(rows: Sequence[RealRow]) -> Callable[[RealRow], RealRow | None]:
    """For a receipt's detected region, the ground-truth box row of the same line (same
    receipt and truth), if that receipt has box crops; None for any other row."""
    found: dict[tuple[str, str], RealRow] = {}
    for row in rows:
        if row.source == "gt":
            found.setdefault((row.doc, row.truth), row)

    def partner(row: RealRow) -> RealRow | None:
        if row.set != "sroie" or row.source != "det":
            return None
        return found.get((row.doc, row.truth))

    return partner


def augmented_texts(row: RealRow, partner: RealRow | None) -> list[str]:
    """The confidence-less candidates of a row: a receipt region's partner box's readings
    (real errors on a slightly different crop); a book line's truth and one perturbation of
    it (seeded by the row, so a row's texts do not depend on the others)."""
    if row.set == "sroie":
        if partner is None:
            return []
        return list(dict.fromkeys(r[0] for r in partner.reads.values() if r is not None))
    texts = [row.truth]
    changed = perturb(row.truth, random.Random(f"{SEED}/{row.set}/{row.id}"))
    if changed is not None:
        texts.append(changed[1])
    return list(dict.fromkeys(texts))


def build_examples(rows: Sequence[RealRow]) -> Examples:
    """Engine candidates for every row, then the confidence-less augmentation. A CTC
    model re-reads through its posterior (its greedy reading), as the scorer does."""
    out = Examples()
    partner = partner_of(rows)
    with_evidence = any(row.ctc for row in rows)
    for row in rows:
        if with_evidence and not row.ctc:
            continue  # a partner row the CTC pass does not read: augmentation texts only
        image = row.crop()
        readings = {engine: _reading(row, engine) for engine in ENGINES}
        ctc = {model: record.scores() for model, record in row.ctc.items()}
        rereads_of = {
            name: ctc[name].reading() if name in ctc else readings.get(name) for name in READERS
        }
        for engine, reading in readings.items():
            if reading is None:
                continue
            rereads = {
                other: r for other, r in rereads_of.items() if other != engine and r is not None
            }
            unit = Unit(
                image, reading.text, ir.Category.text, 1, engine, reading.confidence,
                reading.word_confidence,
            )  # fmt: skip
            label = same_text(reading.text, row.truth, case_sensitive=row.case_sensitive)
            out.add(row, unit, rereads, ctc, label)
        every = {name: r for name, r in rereads_of.items() if r is not None}
        for text in augmented_texts(row, partner(row)):
            unit = Unit(image, text, ir.Category.text, 1, AUGMENTED, None)
            label = same_text(text, row.truth, case_sensitive=row.case_sensitive)
            out.add(row, unit, every, ctc, label)
    return out


def featurize(examples: Examples) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrix and a mask of the examples that could be scored (a unit the scorer
    cannot score gets a verdict, never a score, so it is not training data)."""
    from ocrfleet.config import Settings
    from ocrfleet.scorers.consensus import ConsensusFeatures

    features = ConsensusFeatures(Settings(), [_NoReader(name) for name in READERS])
    computed = features.compute(examples.units, examples.rereads, examples.ctc)
    x = np.zeros((len(computed), len(FEATURE_NAMES)))
    ok = np.zeros(len(computed), dtype=bool)
    for i, value in enumerate(computed):
        if isinstance(value, np.ndarray):
            x[i], ok[i] = value, True
    return x, ok


@dataclass(frozen=True)
class _NoReader:
    """A re-reader that is never asked: training passes the cached readings."""

    name: str
    version: str = "cached"

    def recognise(self, crops):  # pragma: no cover - never called
        raise AssertionError("training reads from the cache")


def reader_versions(rows: Sequence[RealRow]) -> dict[str, list[str]]:
    """engine -> the versions that read the rows: a fit belongs to the readers it saw (the
    default recogniser's readings, not another precision's)."""
    found: dict[str, set[str]] = {}
    for row in rows:
        for engine, version in row.versions.items():
            found.setdefault(engine, set()).add(version)
    return {engine: sorted(versions) for engine, versions in sorted(found.items())}


def rows_sha256(rows: Sequence[RealRow]) -> str:
    """What the examples are built from: ids, truths and every reading."""
    digest = hashlib.sha256()
    for r in rows:
        ctc = sorted(
            (name, c.text, c.min_char_prob, c.min_margin, c.mean_log_prob,
             sorted(c.log_likelihoods.items()))
            for name, c in r.ctc.items()
        )  # fmt: skip
        digest.update(
            json.dumps(
                [r.set, r.id, r.truth, sorted(r.reads.items()), ctc], ensure_ascii=False
            ).encode()
        )
    return digest.hexdigest()


def _code_sha256() -> str:
    """The label rule and the feature code: a change to either invalidates cached features."""
    from ocrfleet import labels
    from ocrfleet.scorers import features

    digest = hashlib.sha256()
    for module in (labels, features):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def load_examples(
    sets: Sequence[str],
    rows: Sequence[RealRow] | None = None,
    *,
    unread: bool = False,
    lazy: Sequence[str] = (),
) -> tuple[Examples, np.ndarray, np.ndarray]:
    """Examples of the rows (default: the cached rows of `sets`), their features and the
    scoreable mask; with `unread`, the features before any re-read (what the screen sees);
    with `lazy`, the features before those readers' re-reads (what the scorer's second
    stage sees). Features are cached beside the rows under the hash of the rows and the
    feature code."""
    rows = (
        [row for name in sets for row in load_rows(name, ctc=True)] if rows is None else list(rows)
    )
    ex = build_examples(rows)
    key = hashlib.sha256(
        (rows_sha256(rows) + json.dumps(list(FEATURE_NAMES)) + _code_sha256()).encode()
    ).hexdigest()[:16]
    suffix = "-unread" if unread else "".join(f"-without-{name}" for name in lazy)
    cache = OUT / f"features-{key}{suffix}.npz"
    if cache.is_file():
        saved = np.load(cache)
        return ex, saved["x"], saved["ok"]
    # A candidate's own engine's evidence is there from the start (the scorer asks for it
    # before any re-read); the other models' come with their re-reads.
    if unread:
        ex.rereads = [{} for _ in ex.units]
        ex.ctc = [
            {k: v for k, v in c.items() if k == u.engine}
            for u, c in zip(ex.units, ex.ctc, strict=True)
        ]
    elif lazy:
        ex.rereads = [{k: v for k, v in r.items() if k not in lazy} for r in ex.rereads]
        ex.ctc = [
            {k: v for k, v in c.items() if k not in lazy or k == u.engine}
            for u, c in zip(ex.units, ex.ctc, strict=True)
        ]
    x, ok = featurize(ex)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, x=x, ok=ok)
    return ex, x, ok


def data_sha256(x: np.ndarray, y: np.ndarray, groups: Sequence[str]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(list(FEATURE_NAMES)).encode())
    digest.update(np.ascontiguousarray(np.round(x, 6) + 0.0, dtype="<f8").tobytes())
    digest.update(np.ascontiguousarray(y, dtype=np.int8).tobytes())
    digest.update("\n".join(groups).encode())
    return digest.hexdigest()


def fold_of(doc: str, n_folds: int = N_FOLDS) -> int:
    return int(hashlib.sha256(doc.encode()).hexdigest(), 16) % n_folds


def monotone() -> list[int]:
    return [1 if name in INCREASING else -1 if name in DECREASING else 0 for name in FEATURE_NAMES]


def fit_trees(x: np.ndarray, y: np.ndarray):
    from sklearn.ensemble import HistGradientBoostingClassifier

    model = HistGradientBoostingClassifier(monotonic_cst=monotone(), **HGB_PARAMS)
    return model.fit(x, y)


def raw_scores(model, x: np.ndarray) -> np.ndarray:
    return model.decision_function(x)


def out_of_fold(x: np.ndarray, y: np.ndarray, docs: Sequence[str]) -> np.ndarray:
    """Log-odds for every row from a model that never saw its document (cached under
    bench/out by the hash of the data and the fit's parameters)."""
    key = hashlib.sha256(
        (data_sha256(x, y, docs) + json.dumps([HGB_PARAMS, monotone()], sort_keys=True)).encode()
    ).hexdigest()[:16]
    cache = OUT / f"oof-{key}.npy"
    if cache.is_file():
        return np.load(cache)
    folds = np.array([fold_of(doc) for doc in docs])
    raw = np.zeros(len(y))
    for k in range(N_FOLDS):
        test = folds == k
        raw[test] = raw_scores(fit_trees(x[~test], y[~test]), x[test])
    OUT.mkdir(parents=True, exist_ok=True)
    np.save(cache, raw)
    return raw


def fit_platt(raw: np.ndarray, y: np.ndarray):
    from sklearn.linear_model import LogisticRegression

    from ocrfleet.scorers.model import Platt

    fit = LogisticRegression(C=1e6, max_iter=1000).fit(raw.reshape(-1, 1), y)
    return Platt(float(fit.coef_[0, 0]), float(fit.intercept_[0]))


def engine_group(engine: str) -> str:
    return engine if engine in ENGINES else OTHER_ENGINE


def choose_thresholds(
    prob: np.ndarray, y: np.ndarray, engines: Sequence[str], sets: Sequence[str]
) -> tuple[dict[str, dict[str, float | None]], dict[str, dict]]:
    """Per engine group: the lowest threshold whose Clopper-Pearson lower bound is >= 0.99
    on all held-back sets pooled, raised until every set's point precision is >= 0.99.
    Only text was fitted: formula and table are uncalibrated."""
    groups = np.array([engine_group(e) for e in engines])
    sets_arr = np.array(sets)
    thresholds: dict[str, dict[str, float | None]] = {}
    evidence: dict[str, dict] = {}
    for group in (*ENGINES, OTHER_ENGINE):
        mask = groups == group
        chosen = choose_threshold(y[mask].tolist(), prob[mask].tolist(), PRECISION)
        value = None if chosen is None else chosen.threshold
        if value is not None:
            for name in sorted(set(sets_arr[mask])):
                m = mask & (sets_arr == name)
                while value is not None:
                    accepted = prob[m] >= value
                    if accepted.sum() == 0 or y[m][accepted].mean() >= PRECISION:
                        break
                    higher = np.unique(prob[mask][prob[mask] > value])
                    value = float(higher[0]) if higher.size else None
        if value is not None:
            accepted = mask & (prob >= value)
            from ocrfleet.thresholds import clopper_pearson

            k, n = int(y[accepted].sum()), int(accepted.sum())
            evidence[group] = {
                "threshold": round(value, 8),
                "accepted": n,
                "of": int(mask.sum()),
                "precision": round(k / n, 6) if n else None,
                "lower_bound_95": round(clopper_pearson(k, n)[0], 6) if n else None,
            }
        else:
            evidence[group] = {"threshold": None, "of": int(mask.sum())}
        thresholds[group] = {
            c: (None if value is None else round(value, 8)) if c == "text" else None
            for c in CATEGORIES
        }
    return thresholds, evidence


def accepted_at(
    prob: np.ndarray, engines: Sequence[str], thresholds: dict[str, dict[str, float | None]]
) -> np.ndarray:
    """Which candidates their (engine group, text) threshold accepts."""
    limits = [thresholds[engine_group(e)]["text"] for e in engines]
    return np.array(
        [t is not None and p >= t for p, t in zip(prob, limits, strict=True)], dtype=bool
    )


def loss_cut(kept: np.ndarray) -> float | None:
    """The highest cut under which at most SCREEN_LOSS of `kept` (the log-odds of accepted
    candidates) fall, rounded down (rounded up, it would send candidates tied at the
    quantile to review); None where nothing was accepted."""
    if not kept.size:
        return None
    return math.floor(float(np.quantile(kept, SCREEN_LOSS, method="lower")) * 1e8) / 1e8


def loss_cuts(
    raw: np.ndarray, accepted: np.ndarray, engines: Sequence[str]
) -> dict[str, float | None]:
    """`loss_cut` per engine group."""
    groups = np.array([engine_group(e) for e in engines])
    return {g: loss_cut(raw[accepted & (groups == g)]) for g in (*ENGINES, OTHER_ENGINE)}


def fit_screen(
    x0: np.ndarray,
    accepted: np.ndarray,
    docs: Sequence[str],
    sets: Sequence[str],
    engines: Sequence[str],
) -> tuple[Any, dict[str, float | None], dict]:
    """The screen's trees (fitted on all rows), its cut on their log-odds per engine group
    (None where the group has no accepted candidate) and the out-of-fold evidence: per
    group and set, the candidates screened and the accepted ones among them. The cut holds the
    loss to SCREEN_LOSS over the group's sets pooled: a set with a handful of accepted
    candidates cannot pin a 1% quantile."""
    raw = out_of_fold(x0, accepted, docs)
    sets_arr = np.array(sets)
    groups = np.array([engine_group(e) for e in engines])
    cuts = loss_cuts(raw, accepted, engines)
    evidence: dict[str, dict] = {}
    for group in (*ENGINES, OTHER_ENGINE):
        mine = groups == group
        cut = cuts[group]
        screened = mine & (raw < cut) if cut is not None else np.zeros_like(mine)
        evidence[group] = {
            str(name): {
                "candidates": int((m := mine & (sets_arr == name)).sum()),
                "screened": int(screened[m].sum()),
                "accepted": int((accepted & m).sum()),
                "accepted_screened": int((accepted & screened & m).sum()),
            }
            for name in sorted(set(sets_arr[mine]))
        }
    return fit_trees(x0, accepted), cuts, evidence


@dataclass(frozen=True)
class SecondStage:
    """The second stage's fitted parts and its out-of-fold evidence."""

    model: Any
    platt: Any
    thresholds: dict[str, dict[str, float | None]]
    cuts: dict[str, float | None]
    evidence: dict
    accepted: np.ndarray  # out of fold: what the path (second stage, then the full model) accepts


def _lowest_keeping(prob: np.ndarray, start: float, keeps: Callable[[float], bool]) -> float | None:
    """The lowest of `prob`'s values at or over `start` at which `keeps(value)` holds (the
    path with early accepts at that value keeps the promise); None if none does."""
    return next(
        (round(float(v), 8) for v in np.unique(prob[prob >= start]) if keeps(float(v))), None
    )


def _second_path(
    prob: np.ndarray, raw: np.ndarray, full_accepted: np.ndarray, limit: float
) -> tuple[np.ndarray, float | None, np.ndarray, np.ndarray]:
    """One engine group's path through the second stage, with early accepts at `prob` >=
    `limit`: (accepted early, the cut, sent to review early, accepted by the path)."""
    early = prob >= limit
    cut = loss_cut(raw[full_accepted & ~early])
    unread = ~early & (raw < (-math.inf if cut is None else cut))
    return early, cut, unread, early | (full_accepted & ~unread)


def _keeps_promise(accepted: np.ndarray, y: np.ndarray, sets: np.ndarray) -> bool:
    """The accepted candidates' CP bound, and every set's point precision, reach PRECISION."""
    from ocrfleet.thresholds import clopper_pearson

    k, n = int((accepted & y).sum()), int(accepted.sum())
    return n == 0 or (
        clopper_pearson(k, n)[0] >= PRECISION
        and all(y[accepted & (sets == name)].mean() >= PRECISION for name in set(sets[accepted]))
    )


def fit_second_stage(
    x1: np.ndarray,
    y: np.ndarray,
    docs: Sequence[str],
    sets: Sequence[str],
    engines: Sequence[str],
    full_prob: np.ndarray,
    full_thresholds: dict[str, dict[str, float | None]],
) -> SecondStage:
    """Step 5 of the procedure. `full_prob` are the full model's out-of-fold
    probabilities; the evidence compares the path with the second stage (as
    `ConsensusScorer.score_against` takes it) against the full model alone, per engine
    group and set: candidates, decided without the lazy readers (accepted, sent to review),
    accepted by each, and how many of those are right."""
    from ocrfleet.thresholds import clopper_pearson

    raw = out_of_fold(x1, y, docs)
    platt = fit_platt(raw, y)
    prob = platt(raw)
    thresholds, threshold_evidence = choose_thresholds(prob, y, engines, sets)
    full_accepted = accepted_at(full_prob, engines, full_thresholds)
    sets_arr = np.array(sets)
    groups_arr = np.array([engine_group(e) for e in engines])
    early = np.zeros(len(y), dtype=bool)
    unread = np.zeros(len(y), dtype=bool)
    cuts: dict[str, float | None] = {}
    for group in (*ENGINES, OTHER_ENGINE):
        # The whole path keeps the promise, not only the early accepts: the group's
        # threshold is raised until its path's bound, and every set's point precision,
        # reach PRECISION (a group's path depends on its own rows only).
        mine = groups_arr == group
        p_g, raw_g, y_g, sets_g = prob[mine], raw[mine], y[mine], sets_arr[mine]
        full_g, full = full_accepted[mine], full_thresholds[group]["text"]
        first = thresholds[group]["text"]
        value = None
        if first is not None and full is not None:
            value = _lowest_keeping(
                p_g,
                first,
                lambda v, p_g=p_g, raw_g=raw_g, full_g=full_g, y_g=y_g, sets_g=sets_g, full=full: (
                    _keeps_promise(_second_path(p_g, raw_g, full_g, max(v, full))[3], y_g, sets_g)
                ),
            )
        thresholds[group]["text"] = value
        if value != first:
            threshold_evidence[group]["raised_to"] = value
        limit = math.inf if value is None else max(value, full)
        early[mine], cuts[group], unread[mine], _ = _second_path(p_g, raw_g, full_g, limit)
    path = early | (full_accepted & ~unread)
    by_set: dict[str, dict[str, dict]] = {}
    for group in (*ENGINES, OTHER_ENGINE):
        mine = groups_arr == group
        by_set[group] = {
            str(name): {
                "candidates": int((m := mine & (sets_arr == name)).sum()),
                "accepted_unread": int((early & m).sum()),
                "review_unread": int((unread & m).sum()),
                "accepted_full": int((full_accepted & m).sum()),
                "lost_unread": int((full_accepted & unread & m).sum()),
                "right_full": int((full_accepted & m & y).sum()),
                "accepted_path": int((path & m).sum()),
                "right_path": int((path & m & y).sum()),
            }
            for name in sorted(set(sets_arr[mine]))
        }
        k, n = int((path & mine & y).sum()), int((path & mine).sum())
        threshold_evidence.setdefault(group, {})["path"] = {
            "accepted": n,
            "precision": round(k / n, 6) if n else None,
            "lower_bound_95": round(clopper_pearson(k, n)[0], 6) if n else None,
        }
    return SecondStage(
        fit_trees(x1, y), platt, thresholds, cuts,
        {"threshold_evidence": threshold_evidence, "by_set": by_set, "lazy": list(LAZY_READERS)},
        path,
    )  # fmt: skip


@dataclass(frozen=True)
class EarlyStage:
    """The early accept's fitted parts and its out-of-fold evidence."""

    model: Any
    platt: Any
    thresholds: dict[str, float | None]
    evidence: dict


def fit_early_stage(
    x0: np.ndarray,
    y: np.ndarray,
    docs: Sequence[str],
    sets: Sequence[str],
    engines: Sequence[str],
    later: np.ndarray,
    full_thresholds: dict[str, dict[str, float | None]],
) -> EarlyStage:
    """Step 6 of the procedure. `later`: what the rest of the path (the second stage, then
    the full model) accepts, out of fold. The threshold per engine group starts as the full
    model's are chosen (step 3) and is raised until the whole path, early accepts first,
    keeps the promise; the evidence counts, per group and set, the candidates, those
    accepted before any re-read, and what the path accepts with and without them."""
    from ocrfleet.thresholds import clopper_pearson

    raw = out_of_fold(x0, y, docs)
    platt = fit_platt(raw, y)
    prob = platt(raw)
    chosen, threshold_evidence = choose_thresholds(prob, y, engines, sets)
    sets_arr = np.array(sets)
    groups_arr = np.array([engine_group(e) for e in engines])
    early = np.zeros(len(y), dtype=bool)
    thresholds: dict[str, float | None] = {}
    for group in (*ENGINES, OTHER_ENGINE):
        mine = groups_arr == group
        p_g, y_g, sets_g, later_g = prob[mine], y[mine], sets_arr[mine], later[mine]
        first, full = chosen[group]["text"], full_thresholds[group]["text"]
        value = None
        if first is not None and full is not None:
            value = _lowest_keeping(
                p_g,
                first,
                lambda v, p_g=p_g, y_g=y_g, sets_g=sets_g, later_g=later_g, full=full: (
                    _keeps_promise((p_g >= max(v, full)) | later_g, y_g, sets_g)
                ),
            )
        thresholds[group] = value
        if value != first:
            threshold_evidence[group]["raised_to"] = value
        if value is not None:
            early[mine] = p_g >= max(value, full)
        path = (early | later) & mine
        k, n = int((path & y).sum()), int(path.sum())
        threshold_evidence[group]["path"] = {
            "accepted": n,
            "precision": round(k / n, 6) if n else None,
            "lower_bound_95": round(clopper_pearson(k, n)[0], 6) if n else None,
        }
    path = early | later
    by_set = {
        group: {
            str(name): {
                "candidates": int((m := (groups_arr == group) & (sets_arr == name)).sum()),
                "accepted_early": int((early & m).sum()),
                "accepted_later": int((later & m).sum()),
                "right_later": int((later & m & y).sum()),
                "accepted_path": int((path & m).sum()),
                "right_path": int((path & m & y).sum()),
            }
            for name in sorted(set(sets_arr[groups_arr == group]))
        }
        for group in (*ENGINES, OTHER_ENGINE)
    }
    return EarlyStage(
        fit_trees(x0, y), platt, thresholds,
        {"threshold_evidence": threshold_evidence, "by_set": by_set},
    )  # fmt: skip


def best_of_n_lines(
    prob: np.ndarray, ex: Examples, mask: np.ndarray
) -> dict[str, dict[str, tuple[str, float]]]:
    """row -> engine -> (text, score) for the engine candidates in `mask`."""
    lines: dict[str, dict[str, tuple[str, float]]] = {}
    for i in np.flatnonzero(mask):
        engine = ex.units[i].engine
        if engine in ENGINES:
            lines.setdefault(ex.rows[i], {})[engine] = (ex.units[i].text, float(prob[i]))
    return lines


def pick(candidates: dict[str, tuple[str, float]], margin: float) -> tuple[str, str]:
    """(engine, text): the primary's candidate unless another beats its score by > margin."""
    ordered = [e for e in ENGINES if e in candidates]
    primary = ordered[0]
    best = max(ordered[1:], key=lambda e: candidates[e][1], default=None)
    if best is not None and candidates[best][1] - candidates[primary][1] > margin:
        return best, candidates[best][0]
    return primary, candidates[primary][0]


def cer_of(texts: dict[str, str], truths: dict[str, str], case: dict[str, bool]) -> float:
    from ocrfleet.labels import canonical

    errors = total = 0
    for row, truth in truths.items():
        t = canonical(truth, case_sensitive=case[row])
        errors += levenshtein(canonical(texts[row], case_sensitive=case[row]), t)
        total += len(t)
    return errors / max(total, 1)


def choose_margin(prob: np.ndarray, ex: Examples, ok: np.ndarray) -> tuple[float, dict]:
    """The smallest margin whose best-of-N CER is <= the best single engine's on every set
    (held-back scores). Where none is, the one whose worst set is least above its best
    engine: never switching (1.0) is no safe default, it is the primary engine's CER (on
    UNLV, one small-caps byline RapidOCR reads "By RalPh Kinney BennetT" holds 14 of its 16
    errors to tesseract's 10, at every margin)."""
    truths = {r: t for r, t in zip(ex.rows, ex.truths, strict=True)}
    case = {r: c for r, c in zip(ex.rows, ex.case_sensitive, strict=True)}
    sets = np.array(ex.sets)
    per_set = {}
    for name in sorted(set(ex.sets)):
        lines = best_of_n_lines(prob, ex, ok & (sets == name))
        lines = {r: c for r, c in lines.items() if len(c) == len(ENGINES)}
        t = {r: truths[r] for r in lines}
        singles = {e: cer_of({r: c[e][0] for r, c in lines.items()}, t, case) for e in ENGINES}
        per_set[name] = (lines, t, singles)
    report = {}
    worst: dict[float, float] = {}
    for margin in MARGINS:
        rows = {}
        worst[margin] = 0.0
        for name, (lines, t, singles) in per_set.items():
            chosen = {r: pick(c, margin)[1] for r, c in lines.items()}
            value = cer_of(chosen, t, case)
            rows[name] = {"cer": round(value, 6), **{e: round(v, 6) for e, v in singles.items()}}
            best = min(singles.values())
            ratio = value / best if best else (float("inf") if value else 0.0)
            worst[margin] = max(worst[margin], ratio)
        report[margin] = rows
        if worst[margin] <= 1.0:
            return margin, rows
    margin = min(MARGINS, key=lambda m: (worst[m], m))
    return margin, report[margin]


def train(rows: Sequence[RealRow], out: Path = WEIGHTS_PATH, keep: dict | None = None) -> dict:
    """Fit on `rows`, write the weights file to `out`, return its document. With `keep` (a
    weights document), every stage is fitted as usual but only the early accept is written,
    into `keep` with its other stages unchanged: the early threshold is held to `keep`'s
    thresholds, and the path it is raised for is the one fitted here (out of fold)."""
    from ocrfleet.scorers.model import trees_from_sklearn
    from ocrfleet.thresholds import auroc

    sets = [name for name in SETS if any(row.set == name for row in rows)]
    ex, x, ok = load_examples(sets, rows)
    y = np.array(ex.labels, dtype=bool)
    docs = ex.docs
    raw = np.zeros(len(y))
    kept_docs = [d for d, k in zip(docs, ok, strict=True) if k]
    raw[ok] = out_of_fold(x[ok], y[ok], kept_docs)
    platt = fit_platt(raw[ok], y[ok])
    prob = platt(raw)
    engines = [u.engine for u in ex.units]
    thresholds, evidence = choose_thresholds(
        prob[ok], y[ok], [e for e, k in zip(engines, ok, strict=True) if k],
        [s for s, k in zip(ex.sets, ok, strict=True) if k],
    )  # fmt: skip
    margin, margin_report = choose_margin(prob, ex, ok)
    set_of = np.array(ex.sets)
    cv = {
        name: round(
            auroc(y[ok & (set_of == name)].tolist(), raw[ok & (set_of == name)].tolist()), 4
        )
        for name in sets
    }
    ok_engines = [e for e, k in zip(engines, ok, strict=True) if k]
    accepted = accepted_at(prob[ok], ok_engines, thresholds)
    _, x0, ok0 = load_examples(sets, rows, unread=True)
    assert (ok0 == ok).all(), "a candidate scoreable with re-reads must be without them"
    screen, cuts, screen_evidence = fit_screen(
        x0[ok], accepted, kept_docs, [s for s, k in zip(ex.sets, ok, strict=True) if k], ok_engines
    )
    _, x1, ok1 = load_examples(sets, rows, lazy=LAZY_READERS)
    assert (ok1 == ok).all(), "a candidate scoreable with re-reads must be without the lazy"
    second = fit_second_stage(
        x1[ok], y[ok], kept_docs, [s for s, k in zip(ex.sets, ok, strict=True) if k],
        ok_engines, prob[ok], thresholds,
    )  # fmt: skip
    early = fit_early_stage(
        x0[ok], y[ok], kept_docs, [s for s, k in zip(ex.sets, ok, strict=True) if k],
        ok_engines, second.accepted, thresholds if keep is None else keep["thresholds"],
    )  # fmt: skip
    early_document = {
        "trees": trees_from_sklearn(early.model).to_json(),
        "calibration": early.platt.to_json(),
        "thresholds": early.thresholds,
    }
    row_hashes = {name: rows_sha256([r for r in rows if r.set == name]) for name in sets}
    if keep is not None:
        early.evidence["rows_sha256"] = row_hashes
        early.evidence["data_sha256"] = data_sha256(x0[ok], y[ok], kept_docs)
        document = {
            **keep,
            "format": WEIGHTS_FORMAT,
            "early": early_document,
            "training": {**keep["training"], "early": early.evidence},
        }
        out.write_text(json.dumps(document, indent=None, ensure_ascii=True) + "\n", "utf-8")
        return document
    final = trees_from_sklearn(fit_trees(x[ok], y[ok]))
    document = {
        "format": WEIGHTS_FORMAT,
        "model": "HistGradientBoostingClassifier (monotone constraints) + Platt map",
        "feature_names": list(FEATURE_NAMES),
        "trees": final.to_json(),
        "calibration": platt.to_json(),
        "thresholds": thresholds,
        "best_of_n_margin": margin,
        "screen": {"trees": trees_from_sklearn(screen).to_json(), "cuts": cuts},
        "second": {
            "trees": trees_from_sklearn(second.model).to_json(),
            "calibration": second.platt.to_json(),
            "thresholds": {g: t["text"] for g, t in second.thresholds.items()},
            "cuts": second.cuts,
        },
        "early": early_document,
        "training": {
            "source": "bench/train_consensus.py on bench/realrows.py rows",
            "readers": reader_versions(rows),
            "rows_sha256": row_hashes,
            "data_sha256": data_sha256(x[ok], y[ok], kept_docs),
            "n": int(ok.sum()),
            "n_correct": int(y[ok].sum()),
            "n_by_set": {name: int((ok & (set_of == name)).sum()) for name in sets},
            "left_out_unscored": int((~ok).sum()),
            "params": HGB_PARAMS,
            "folds": N_FOLDS,
            "cv_auroc_out_of_fold": cv,
            "threshold_evidence": evidence,
            "precision_target": PRECISION,
            "best_of_n": {"margin": margin, "cer_by_set": margin_report},
            "screen": {"loss_target": SCREEN_LOSS, "by_set": screen_evidence},
            "second": second.evidence,
            "early": early.evidence,
        },
    }  # fmt: skip
    out.write_text(json.dumps(document, indent=None, ensure_ascii=True) + "\n", encoding="utf-8")
    return document


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=WEIGHTS_PATH)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument(
        "--keep",
        type=Path,
        help="a weights file whose stages are kept: only the early accept is fitted into it",
    )
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    rows = [row for name in args.sets.split(",") for row in load_rows(name, ctc=True)]
    keep = None if args.keep is None else json.loads(args.keep.read_text(encoding="utf-8"))
    document = train(rows, args.out, keep)
    t = document["training"]
    print(f"wrote {args.out}")
    print(f"data_sha256 {t['data_sha256']}")
    print(f"examples {t['n']} correct {t['n_correct']} by set {t['n_by_set']}")
    print(f"out-of-fold auroc {t['cv_auroc_out_of_fold']}")
    for group, info in t["threshold_evidence"].items():
        print(f"threshold {group}: {info}")
    print(f"best-of-n margin {document['best_of_n_margin']}: {t['best_of_n']['cer_by_set']}")
    for group, by_set in t["screen"]["by_set"].items():
        print(f"screen {group} cut {document['screen']['cuts'][group]}: {by_set}")
    second = document["second"]
    for group, by_set in t["second"]["by_set"].items():
        print(
            f"second stage {group} threshold {second['thresholds'][group]} cut "
            f"{second['cuts'][group]} path {t['second']['threshold_evidence'][group]['path']}: "
            f"{by_set}"
        )
    for group, by_set in t["early"]["by_set"].items():
        print(
            f"early accept {group} threshold {document['early']['thresholds'][group]} path "
            f"{t['early']['threshold_evidence'][group]['path']}: {by_set}"
        )


if __name__ == "__main__":
    main()
