"""What the consensus scorer looks at in one unit, as a fixed-order vector of numbers.

Kinds of evidence, each cheap on a CPU:

- the candidate engine's own confidence (engines are calibrated differently, so each known
  engine has its own column and any other engine's confidence a shared one), and the
  confidence of its least confident word where the engine gives word confidences (RapidOCR's
  per-character scores, tesseract's per word: one doubtful comma shows there, the line's
  mean hides it); an engine without confidence (MiniCPM-OCR) sets `conf_missing` and is
  scored on the rest, with no penalty built in: the fit decides what missing confidence is
  worth;
- agreement with independent re-reads of the same crop by RapidOCR and tesseract (each
  reader that is not the candidate's own engine): normalised edit similarity, exact and
  folded equality, the reader's confidence, and whether the re-reads agree among
  themselves. Two engines with different errors rarely make the same mistake;

plus how much ink the crop's left and right edges cut (a region that clips a character
reads wrong in every engine alike, so agreement cannot see it), and text features that flag
shapes engine errors often take (stray non-ASCII characters,
digits inside words, mixed case inside a word). Texts are compared in
`ocrfleet.labels.canonical` form, the same form the labels use.

Not used: render-and-compare (the candidate drawn by the frozen renderer and compared with
the crop): rendering and comparing took 11.2 of 15.5 s of feature time on 240 UNLV units,
and a page's scoring time is what `ocrfleet run` pays per region. The Jev scorer renders.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.labels import canonical
from ocrfleet.metrics import levenshtein, normalize_ws
from ocrfleet.scorers.render import RenderError
from ocrfleet.scorers.render.bounds import CONTENT_THRESHOLD, background_level
from ocrfleet.scorers.render.formula import latex_body
from ocrfleet.scorers.render.table import parse_table

# Engines whose confidence has its own columns (their scales differ: RapidOCR's CTC
# probabilities sit near 1, tesseract's word confidences spread much wider). They are also
# the re-readers, each with its own agreement columns.
CONFIDENCE_ENGINES = ("rapidocr", "tesseract")
READERS = CONFIDENCE_ENGINES
_READER_COLUMNS = ("missing", "sim", "exact", "exact_fold", "conf", "wconf")
# The candidate's own confidence and its least confident word's, per known engine and other.
_ENGINE_CONFIDENCES = tuple(
    f"{kind}_{engine}" for kind in ("conf", "wconf") for engine in (*CONFIDENCE_ENGINES, "other")
)

FEATURE_NAMES: tuple[str, ...] = (
    # the candidate engine's confidence
    "conf_missing",
    *_ENGINE_CONFIDENCES,
    # each independent re-read
    *(f"{reader}_{column}" for reader in READERS for column in _READER_COLUMNS),
    # all re-reads together
    "reread_count",
    "reread_max_sim",
    "reread_min_sim",
    "reread_all_exact",
    "rereads_agree",
    "agree_word_share",
    "agree_len_logratio",
    "agree_digits_equal",
    # the crop: ink cut by its left or right edge (a clipped first or last character)
    "edge_ink_left",
    "edge_ink_right",
    # the text itself (not its length: how long lines are is the document kind's habit,
    # and a fit on receipts' short lines learned it as evidence that did not hold on books)
    "text_digit_share",
    "text_punct_share",
    "text_nonascii_share",
    "text_has_nonascii",
    "text_mixed_alnum_words",
    "text_inner_caps_words",
    "text_single_char_words",
    "category_formula",
    "category_table",
)

# Features whose larger values can only mean "more likely right" (monotone in the fit).
# Of them, a re-read sets these per reader and these over all re-reads; each lies in [0, 1].
_READER_INCREASING = ("sim", "exact", "exact_fold")
_AGREEMENT_INCREASING = (
    "reread_max_sim",
    "reread_min_sim",
    "reread_all_exact",
    "agree_word_share",
    "agree_digits_equal",
)
INCREASING: tuple[str, ...] = (
    *_ENGINE_CONFIDENCES,
    *(f"{reader}_{column}" for reader in READERS for column in _READER_INCREASING),
    *_AGREEMENT_INCREASING,
)
_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}


@dataclass(frozen=True)
class Reading:
    """One engine's reading of a crop."""

    engine: str
    text: str
    confidence: float | None
    word_confidence: float | None = None  # its least confident word's, if it gave words


def least_word_confidence(words: Sequence[ir.Word] | None) -> float | None:
    """The lowest confidence among the words an engine placed itself (approximate words
    carry no confidence of their own); None when there is none."""
    values = [w.confidence for w in words or () if w.confidence is not None and not w.approximate]
    return min(values) if values else None


def visible_text(text: str, category: ir.Category) -> str:
    """The characters a reader would see: a table's cell texts, a formula's LaTeX body."""
    category = ir.Category(category)
    if category == ir.Category.table:
        try:
            cells, _, _ = parse_table(text)
        except (RenderError, ValueError):
            return normalize_ws(re.sub(r"<[^>]*>", " ", text))
        return normalize_ws(" ".join(cell.text for cell in cells))
    if category == ir.Category.formula:
        try:
            return normalize_ws(latex_body(text))
        except RenderError:
            return normalize_ws(text)
    return normalize_ws(text)


def _conf_logit(confidence: float | None) -> float:
    """Confidence on a log-odds scale, clipped: differences near 1 matter for CTC scores."""
    if confidence is None or not math.isfinite(confidence):
        return 0.0
    p = min(max(float(confidence), 1e-4), 1.0 - 1e-4)
    return math.log(p / (1.0 - p))


def _edit_similarity(a: str, b: str) -> float:
    if not a and not b:
        return 1.0
    return 1.0 - levenshtein(a, b) / max(len(a), len(b))


def _alnum(text: str) -> str:
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def _word_share(candidate: str, second: str) -> float:
    words = candidate.split()
    if not words:
        return 0.0
    pool: dict[str, int] = {}
    for word in second.split():
        pool[word] = pool.get(word, 0) + 1
    hits = 0
    for word in words:
        if pool.get(word, 0) > 0:
            pool[word] -= 1
            hits += 1
    return hits / len(words)


def _word_or_line(word_confidence: float | None, confidence: float | None) -> float | None:
    """The least word confidence, or the line's where the engine gave no word confidences."""
    if word_confidence is not None and math.isfinite(word_confidence):
        return word_confidence
    return confidence


def engine_features(
    engine: str, confidence: float | None, word_confidence: float | None = None
) -> dict[str, float]:
    missing = confidence is None or not math.isfinite(confidence)
    features = {"conf_missing": float(missing), "conf_other": 0.0, "wconf_other": 0.0}
    for name in CONFIDENCE_ENGINES:
        features[f"conf_{name}"] = 0.0
        features[f"wconf_{name}"] = 0.0
    if not missing:
        suffix = engine if engine in CONFIDENCE_ENGINES else "other"
        features[f"conf_{suffix}"] = _conf_logit(confidence)
        features[f"wconf_{suffix}"] = _conf_logit(_word_or_line(word_confidence, confidence))
    return features


def rereads_for(engine: str) -> tuple[str, ...]:
    """The readers whose reading of a crop is independent of `engine`'s candidate."""
    return tuple(reader for reader in READERS if reader != engine)


def agreement_features(candidate: str, rereads: dict[str, Reading]) -> dict[str, float]:
    """`candidate` is visible text; `rereads` the independent readings by reader name (a
    reader that failed or was not asked is absent)."""
    features = {f"{reader}_missing": 1.0 for reader in READERS}
    for reader in READERS:
        for column in _READER_COLUMNS[1:]:
            features[f"{reader}_{column}"] = 0.0
    mine = canonical(candidate)
    sims, exacts, others = [], [], []
    for reader in READERS:
        reading = rereads.get(reader)
        if reading is None:
            continue
        other = canonical(reading.text)
        sim = _edit_similarity(mine, other)
        exact = float(mine == other)
        features.update(
            {
                f"{reader}_missing": 0.0,
                f"{reader}_sim": sim,
                f"{reader}_exact": exact,
                f"{reader}_exact_fold": float(_alnum(mine) == _alnum(other)),
                f"{reader}_conf": _conf_logit(reading.confidence),
                f"{reader}_wconf": _conf_logit(
                    _word_or_line(reading.word_confidence, reading.confidence)
                ),
            }
        )
        sims.append(sim)
        exacts.append(exact)
        others.append(other)
    digits = [ch for ch in mine if ch.isdigit()]
    features.update(
        reread_count=float(len(others)),
        reread_max_sim=max(sims, default=0.0),
        reread_min_sim=min(sims, default=0.0),
        reread_all_exact=float(bool(exacts) and all(exacts)),
        rereads_agree=float(len(others) > 1 and len(set(others)) == 1),
        agree_word_share=max((_word_share(mine, other) for other in others), default=0.0),
        agree_len_logratio=(
            0.0
            if not others
            else max((math.log((len(mine) + 1) / (len(o) + 1)) for o in others), key=abs)
        ),
        agree_digits_equal=float(
            bool(others) and all(digits == [ch for ch in o if ch.isdigit()] for o in others)
        ),
    )
    return features


def optimistic(vector: np.ndarray, engine: str) -> tuple[np.ndarray, np.ndarray]:
    """A candidate's features before its re-reads, with every re-read agreeing: `vector`
    (computed with no re-reads) with each reader that would re-read it present and its
    `INCREASING` agreement columns at their largest, and the mask of the columns whose
    most favourable value is unknown (a reader's confidence, the length ratio, whether
    two re-reads agree). The trees' `upper_raw` over that row bounds the score any re-read
    could give the candidate: monotone constraints make larger increasing values never
    lower it."""
    row = np.array(vector, dtype=np.float64)
    free = np.zeros(len(FEATURE_NAMES), dtype=bool)
    readers = rereads_for(engine)
    for reader in readers:
        row[_INDEX[f"{reader}_missing"]] = 0.0
        for column in _READER_INCREASING:
            row[_INDEX[f"{reader}_{column}"]] = 1.0
        free[_INDEX[f"{reader}_conf"]] = free[_INDEX[f"{reader}_wconf"]] = True
    row[_INDEX["reread_count"]] = float(len(readers))
    for name in _AGREEMENT_INCREASING:
        row[_INDEX[name]] = 1.0
    free[_INDEX["agree_len_logratio"]] = True
    free[_INDEX["rereads_agree"]] = len(readers) > 1
    return row, free


def text_features(text: str, category: ir.Category) -> dict[str, float]:
    n = max(len(text), 1)
    words = text.split()
    n_words = max(len(words), 1)
    nonascii = sum(1 for ch in text if ord(ch) > 127)
    punct = sum(1 for ch in text if unicodedata.category(ch).startswith("P"))
    mixed = sum(1 for w in words if any(ch.isdigit() for ch in w) and any(ch.isalpha() for ch in w))
    inner_caps = sum(1 for w in words if re.search(r"[a-z][A-Z]", w))
    singles = sum(1 for w in words if len(w) == 1 and w not in {"a", "A", "I", "&", "-"})
    category = ir.Category(category)
    return {
        "text_digit_share": sum(ch.isdigit() for ch in text) / n,
        "text_punct_share": punct / n,
        "text_nonascii_share": nonascii / n,
        "text_has_nonascii": float(nonascii > 0),
        "text_mixed_alnum_words": mixed / n_words,
        "text_inner_caps_words": inner_caps / n_words,
        "text_single_char_words": singles / n_words,
        "category_formula": float(category == ir.Category.formula),
        "category_table": float(category == ir.Category.table),
    }


EDGE_COLUMNS = 2


def crop_features(crop: Image.Image) -> dict[str, float]:
    """Share of pixel rows with ink in the outermost columns, left and right (ink is
    judged as the renderer's `content_bounds` judges it)."""
    gray = np.asarray(crop.convert("L"), dtype=np.int16)
    if gray.size == 0:
        return {"edge_ink_left": 0.0, "edge_ink_right": 0.0}
    ink = np.abs(gray - background_level(gray.astype(np.uint8))) > CONTENT_THRESHOLD
    return {
        "edge_ink_left": float(ink[:, :EDGE_COLUMNS].any(axis=1).mean()),
        "edge_ink_right": float(ink[:, -EDGE_COLUMNS:].any(axis=1).mean()),
    }


def feature_vector(values: dict[str, float]) -> np.ndarray:
    missing = [name for name in FEATURE_NAMES if name not in values]
    if missing:
        raise KeyError(f"features not computed: {missing}")
    vector = np.array([values[name] for name in FEATURE_NAMES], dtype=np.float64)
    if not np.all(np.isfinite(vector)):
        bad = [n for n, v in zip(FEATURE_NAMES, vector, strict=True) if not math.isfinite(v)]
        raise ValueError(f"non-finite features: {bad}")
    return vector


def unit_features(
    crop: Image.Image,
    text: str,
    category: ir.Category,
    engine: str,
    confidence: float | None,
    rereads: dict[str, Reading],
    word_confidence: float | None = None,
) -> np.ndarray:
    """All features of one unit, in FEATURE_NAMES order. `rereads`: the independent
    readings of the crop by reader name, their texts as the engines gave them."""
    shown = visible_text(text, category)
    values: dict[str, float] = {}
    values.update(engine_features(engine, confidence, word_confidence))
    values.update(
        agreement_features(
            shown,
            {
                name: Reading(
                    r.engine,
                    visible_text(r.text, ir.Category.text),
                    r.confidence,
                    r.word_confidence,
                )
                for name, r in rereads.items()
            },
        )
    )
    values.update(crop_features(crop))
    values.update(text_features(shown, category))
    return feature_vector(values)
