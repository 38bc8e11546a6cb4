"""What the consensus scorer looks at in one unit, as a fixed-order vector of numbers.

Three kinds of evidence, each cheap on a CPU:

- the candidate engine's own confidence (engines are calibrated differently, so each known
  engine has its own column; an engine without confidence fills none of them);
- agreement with an independent second read of the same crop by another engine: two
  engines with different errors rarely make the same mistake;
- render-and-compare: the candidate drawn by the frozen renderer into the crop's content
  box, compared with the crop (a dropped or extra word shows as a width or a word-gap
  mismatch, a wrong line count as a row-profile mismatch);

plus text features that flag shapes engine errors often take (stray non-ASCII characters,
digits inside words, mixed case inside a word).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.metrics import levenshtein, normalize_ws
from ocrfleet.scorers.render import RenderError
from ocrfleet.scorers.render.bounds import CONTENT_THRESHOLD, Box, background_level
from ocrfleet.scorers.render.formula import latex_body
from ocrfleet.scorers.render.table import parse_table

# Engines whose confidence has its own columns (their scales differ: RapidOCR's CTC
# probabilities sit near 1, tesseract's word confidences spread much wider).
CONFIDENCE_ENGINES = ("rapidocr", "tesseract")

FEATURE_NAMES: tuple[str, ...] = (
    # the candidate engine's confidence
    "engine_rapidocr",
    "engine_tesseract",
    "conf_rapidocr",
    "conf_tesseract",
    # the second read
    "second_missing",
    "second_conf_rapidocr",
    "second_conf_tesseract",
    "agree_sim",
    "agree_exact",
    "agree_exact_nospace",
    "agree_exact_alnum",
    "agree_word_share",
    "agree_len_logratio",
    "agree_digits_equal",
    # render and compare
    "render_width_logratio",
    "render_height_logratio",
    "render_density_logratio",
    "render_colprofile_corr",
    "render_rowprofile_corr",
    "render_gap_diff",
    # the text itself
    "text_log_len",
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


@dataclass(frozen=True)
class Reading:
    """One engine's reading of a crop."""

    engine: str
    text: str
    confidence: float | None


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


def engine_features(engine: str, confidence: float | None) -> dict[str, float]:
    features = {}
    for name in CONFIDENCE_ENGINES:
        own = engine == name
        features[f"engine_{name}"] = 1.0 if own else 0.0
        features[f"conf_{name}"] = _conf_logit(confidence) if own else 0.0
    return features


def agreement_features(candidate: str, second: Reading | None) -> dict[str, float]:
    """`candidate` and the second read's text are both visible text (see visible_text)."""
    features = {name: 0.0 for name in FEATURE_NAMES if name.startswith(("agree_", "second_"))}
    if second is None:
        features["second_missing"] = 1.0
        return features
    other = normalize_ws(second.text)
    for name in CONFIDENCE_ENGINES:
        if second.engine == name:
            features[f"second_conf_{name}"] = _conf_logit(second.confidence)
    digits = [ch for ch in candidate if ch.isdigit()]
    features.update(
        agree_sim=_edit_similarity(candidate, other),
        agree_exact=float(candidate == other),
        agree_exact_nospace=float(candidate.replace(" ", "") == other.replace(" ", "")),
        agree_exact_alnum=float(_alnum(candidate) == _alnum(other)),
        agree_word_share=_word_share(candidate, other),
        agree_len_logratio=math.log((len(candidate) + 1) / (len(other) + 1)),
        agree_digits_equal=float(digits == [ch for ch in other if ch.isdigit()]),
    )
    return features


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
        "text_log_len": math.log1p(len(text)),
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


def ink_mask(image: Image.Image) -> np.ndarray:
    """Content pixels, by the same rule as the renderer's `content_bounds`."""
    gray = np.asarray(image.convert("L"), dtype=np.uint8)
    background = background_level(gray)
    return np.abs(gray.astype(np.int16) - background) > CONTENT_THRESHOLD


def _smooth(profile: np.ndarray, width: int) -> np.ndarray:
    width = max(1, int(width))
    if width == 1 or profile.size < 2:
        return profile.astype(np.float64)
    kernel = np.ones(width) / width
    return np.convolve(profile.astype(np.float64), kernel, mode="same")


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    denominator = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / denominator) if denominator > 0 else 0.0


def _gaps(profile: np.ndarray, min_width: int) -> int:
    """Runs of empty columns at least `min_width` wide between ink (word gaps)."""
    ink = np.flatnonzero(profile > 0)
    if ink.size < 2:
        return 0
    steps = np.diff(ink) - 1
    return int((steps >= max(1, min_width)).sum())


def _ink_extent(mask: np.ndarray) -> tuple[int, int]:
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return 0, 0
    return int(cols[-1] - cols[0] + 1), int(rows[-1] - rows[0] + 1)


def render_features(crop: Image.Image, rendered: Image.Image, box: Box) -> dict[str, float]:
    """Compare the crop with the candidate rendered into the crop's content box."""
    x0, y0, x1, y1 = box
    crop_ink = ink_mask(crop)[y0:y1, x0:x1]
    # The rendered canvas is white paper, black ink.
    drawn = np.asarray(rendered.convert("L"), dtype=np.uint8)[y0:y1, x0:x1] < 128
    height = y1 - y0
    drawn_w, drawn_h = _ink_extent(drawn)
    crop_w, crop_h = _ink_extent(crop_ink)
    col_c, col_r = crop_ink.sum(axis=0), drawn.sum(axis=0)
    row_c, row_r = crop_ink.sum(axis=1), drawn.sum(axis=1)
    # About a third of a line height: blurs letters, keeps word gaps.
    line_h = max(1, min(height, crop_h))
    gap_min = max(2, round(0.3 * line_h))
    crop_gaps, drawn_gaps = _gaps(col_c, gap_min), _gaps(col_r, gap_min)
    return {
        "render_width_logratio": math.log((drawn_w + 1) / (max(crop_w, 1) + 1)),
        "render_height_logratio": math.log((drawn_h + 1) / (max(crop_h, 1) + 1)),
        "render_density_logratio": math.log((drawn.sum() + 1) / (crop_ink.sum() + 1)),
        "render_colprofile_corr": _corr(_smooth(col_c, line_h / 3), _smooth(col_r, line_h / 3)),
        "render_rowprofile_corr": _corr(_smooth(row_c, 3), _smooth(row_r, 3)),
        "render_gap_diff": (drawn_gaps - crop_gaps) / (crop_gaps + 1),
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
    second: Reading | None,
    rendered: Image.Image,
    box: Box,
) -> np.ndarray:
    """All features of one unit, in FEATURE_NAMES order."""
    shown = visible_text(text, category)
    values: dict[str, float] = {}
    values.update(engine_features(engine, confidence))
    values.update(agreement_features(shown, second))
    values.update(render_features(crop, rendered, box))
    values.update(text_features(shown, category))
    return feature_vector(values)
