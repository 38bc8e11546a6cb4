"""What the consensus scorer looks at in one unit, as a fixed-order vector of numbers.

Kinds of evidence, each cheap on a CPU:

- the candidate engine's own confidence (engines are calibrated differently, so each known
  engine has its own column and any other engine's confidence a shared one), and the
  confidence of its least confident word where the engine gives word confidences (RapidOCR's
  per-character scores, tesseract's per word: one doubtful comma shows there, the line's
  mean hides it); an engine without confidence (MiniCPM-OCR) sets `conf_missing` and is
  scored on the rest, with no penalty built in: the fit decides what missing confidence is
  worth;
- agreement with independent re-reads of the same crop by RapidOCR, tesseract and
  EasyOCR (each reader that is not the candidate's own engine): normalised edit
  similarity, exact and folded equality, the reader's confidence, and whether the re-reads
  agree among themselves. Engines trained on different data rarely make the same mistake;
- character evidence from each CTC model (RapidOCR's PP-OCR recogniser, EasyOCR's CRNN),
  the candidate's own engine's included: on the model's own greedy reading, its weakest
  character's probability, its smallest top-2 margin and its mean log-probability per
  character (a crisp crop reads with every character near 1; one smudged character shows
  as one weak frame); and cross-scores, the forced-alignment log-likelihood per character
  of the candidate's text under the model, as a gap to the model's own reading (0: the
  model finds the candidate as plausible as what it read itself) and against the most
  plausible rival reading of another engine (Mor & Wolf, 2018: sequence-level CTC scores
  of this kind separate misreads that every engine's confidence misses);

plus one feature of the text itself, full stops followed by a lower-case word
(`stops_before_lowercase`: commas whose tails a scan lost, which every reader misreads the
same way), and the category. Texts are compared in `ocrfleet.labels.canonical` form, the
same form the labels use.

Not used any more: the text's shape (digit, punctuation and non-ASCII shares, mixed
letters and digits, inner capitals, one-character words) and the ink cut by the crop's left
and right edges. They were proxies for misreads the engines' agreement could not see; with
the character evidence, the fit without them ranked book lines from receipts better (out of
fold 0.983, 0.981 with them) and, at the same precision promise, accepted more RapidOCR
candidates (receipts 0.472 against 0.432, books 0.772 against 0.711; docs/notes/issue-17.md).

Not used: render-and-compare (the candidate drawn by the frozen renderer and compared with
the crop): rendering and comparing took 11.2 of 15.5 s of feature time on 240 UNLV units,
and a page's scoring time is what `ocrfleet run` pays per region. The Jev scorer renders.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ocrfleet import ir
from ocrfleet.labels import canonical, tight
from ocrfleet.metrics import levenshtein, normalize_ws
from ocrfleet.scorers.render import RenderError
from ocrfleet.scorers.render.formula import latex_body
from ocrfleet.scorers.render.table import parse_table

# Engines whose confidence has its own columns (their scales differ: RapidOCR's CTC
# probabilities sit near 1, tesseract's word confidences spread much wider). They are also
# the re-readers, each with its own agreement columns.
CONFIDENCE_ENGINES = ("rapidocr", "tesseract", "easyocr")
READERS = CONFIDENCE_ENGINES
_READER_COLUMNS = ("missing", "sim", "exact", "exact_fold", "conf", "wconf")
# The re-readers whose posterior matrices give character evidence and cross-scores.
CTC_MODELS = ("rapidocr", "easyocr")
_CTC_COLUMNS = ("missing", "min_prob", "margin", "mean_lp", "cand_lp", "cand_gap")
# A per-character log-likelihood is clipped to this range: a text a model cannot align at
# all (-inf) is as implausible as one it aligns terribly.
LOG_PROB_FLOOR = -20.0
LOG_RATIO_CAP = 50.0  # nats: a likelihood ratio between two texts is clipped to +-this
GAP_CEILING = 5.0  # a candidate more plausible than the model's own reading by more: as this
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
    # each CTC model's evidence on its own reading, and the candidate's likelihood under it
    *(f"ctc_{model}_{column}" for model in CTC_MODELS for column in _CTC_COLUMNS),
    # the most plausible other reading against the candidate, under any CTC model
    "ctc_rival_gap",
    # full stops the next word's case says are commas
    "text_stop_lower",
    # the category the unit is judged as
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
# A CTC model's columns, each with its range: a surer reading, a likelier candidate can
# only mean "more likely right" (monotone in the fit), so a model not yet asked takes the
# favourable end of each in `optimistic`, the other in `pessimistic`.
_CTC_RANGE = {
    "min_prob": (0.0, 1.0),
    "margin": (0.0, 1.0),
    "mean_lp": (LOG_PROB_FLOOR, 0.0),
    "cand_lp": (LOG_PROB_FLOOR, 0.0),
    "cand_gap": (-LOG_RATIO_CAP, GAP_CEILING),
}
_CTC_INCREASING = tuple(_CTC_RANGE)
INCREASING: tuple[str, ...] = (
    *_ENGINE_CONFIDENCES,
    *(f"{reader}_{column}" for reader in READERS for column in _READER_INCREASING),
    *_AGREEMENT_INCREASING,
    *(f"ctc_{model}_{column}" for model in CTC_MODELS for column in _CTC_INCREASING),
)
# Features whose larger values can only mean "more likely wrong": a rival reading the models
# find likelier than the candidate. Its range is +-LOG_RATIO_CAP.
DECREASING: tuple[str, ...] = ("ctc_rival_gap", "text_stop_lower")
_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}


@dataclass(frozen=True)
class Reading:
    """One engine's reading of a crop."""

    engine: str
    text: str
    confidence: float | None
    word_confidence: float | None = None  # its least confident word's, if it gave words


@dataclass(frozen=True)
class CtcScores:
    """What one CTC model says about a crop: the evidence of its own greedy reading and
    the log-likelihood (natural log) of any text under it. Built from a
    `ocrfleet.scorers.ctc.Posterior` when scoring, from cached values when training."""

    engine: str
    text: str  # the model's greedy reading
    min_char_prob: float
    min_margin: float
    mean_log_prob: float
    log_likelihood: Callable[[str], float]

    def label_log_likelihood(self, text: str) -> float:
        """log P of the text `text` stands for by the label rule: written as given or without
        the whitespace the rule drops (`labels.tight`), the spellings a reader may print.
        Otherwise a model sure there is no space in "reading:048213" scores "reading:
        048213", the same text, as a misreading."""
        spelled = tight(text)
        if spelled == text:
            return self.log_likelihood(text)
        return float(np.logaddexp(self.log_likelihood(text), self.log_likelihood(spelled)))

    def reading(self) -> Reading:
        """The model's reading as a re-read: its text, the geometric mean of its characters'
        probabilities as the line's confidence, the weakest character as the least word's."""
        return Reading(self.engine, self.text, math.exp(self.mean_log_prob), self.min_char_prob)


def ctc_scores(posterior) -> CtcScores:
    """A posterior's evidence, its likelihoods computed on demand and kept per text."""
    evidence = posterior.evidence()
    memo: dict[str, float] = {}

    def log_likelihood(text: str) -> float:
        if text not in memo:
            memo[text] = float(posterior.log_likelihood(text))
        return memo[text]

    return CtcScores(
        posterior.engine,
        posterior.text(),
        float(evidence.min_char_prob),
        float(evidence.min_margin),
        float(evidence.mean_log_prob),
        log_likelihood,
    )


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


def _per_char(log_likelihood: float, text: str) -> float:
    value = log_likelihood / max(len(text), 1)
    return min(max(value, LOG_PROB_FLOOR), 0.0) if not math.isnan(value) else LOG_PROB_FLOOR


def _ratio(a: float, b: float) -> float:
    """log P(a) - log P(b), clipped: one misread character is a few nats; a text the model
    cannot align at all is as bad as one off by many characters."""
    if not math.isfinite(a) and not math.isfinite(b):
        return 0.0
    difference = a - b if math.isfinite(a - b) else (LOG_RATIO_CAP if a > b else -LOG_RATIO_CAP)
    return min(max(difference, -LOG_RATIO_CAP), LOG_RATIO_CAP)


def ctc_features(
    candidate: str, ctc: Mapping[str, CtcScores], rivals: Sequence[str]
) -> dict[str, float]:
    """`candidate` is visible text; `ctc` the CTC models' scores of the crop by model name
    (the candidate's own engine's too, if it is one: its evidence on its own reading);
    `rivals` the other engines' visible readings of the crop. Every likelihood is that of
    the text's label (`CtcScores.label_log_likelihood`). The candidate's is given per
    character (how well the whole line fits) and as a ratio to the model's own reading and
    to the best rival (one misread character moves the ratio by nats, the per-character
    mean by a few hundredths)."""
    features: dict[str, float] = {}
    mine = canonical(candidate)
    others = [text for text in dict.fromkeys(rivals) if canonical(text) != mine]
    rival_gaps = []
    for model in CTC_MODELS:
        scores = ctc.get(model)
        if scores is None:
            features[f"ctc_{model}_missing"] = 1.0
            for column in _CTC_COLUMNS[1:]:
                features[f"ctc_{model}_{column}"] = 0.0
            continue
        cand = scores.label_log_likelihood(candidate)
        features.update(
            {
                f"ctc_{model}_missing": 0.0,
                f"ctc_{model}_min_prob": float(scores.min_char_prob),
                f"ctc_{model}_margin": float(scores.min_margin),
                f"ctc_{model}_mean_lp": max(float(scores.mean_log_prob), LOG_PROB_FLOOR),
                f"ctc_{model}_cand_lp": _per_char(cand, candidate),
                f"ctc_{model}_cand_gap": min(
                    _ratio(cand, scores.label_log_likelihood(scores.text)), GAP_CEILING
                ),
            }
        )
        rival_gaps.extend(_ratio(scores.label_log_likelihood(t), cand) for t in others)
    # No rival (every reading is the candidate's) counts as the least plausible rival.
    features["ctc_rival_gap"] = max(rival_gaps, default=-LOG_RATIO_CAP)
    return features


def _pending_columns(readers: Sequence[str], engine: str) -> list[str]:
    """The columns a pending reader sets: its agreement and, for a CTC model other than
    the candidate's own engine, its character evidence."""
    columns = [f"{reader}_{column}" for reader in readers for column in _READER_COLUMNS]
    for model in CTC_MODELS:
        if model in readers and model != engine:
            columns.extend(f"ctc_{model}_{column}" for column in _CTC_COLUMNS)
    return columns


def _bound_row(
    vector: np.ndarray, engine: str, pending: Sequence[str], favourable: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`vector` (computed without the `pending` readers) with each of them present and at
    the favourable (or unfavourable) end of every monotone column it sets, and the mask of
    the columns whose value stays unknown."""
    end = 1 if favourable else 0
    row = np.array(vector, dtype=np.float64)
    free = np.zeros(len(FEATURE_NAMES), dtype=bool)
    for name in _pending_columns(pending, engine):
        free[_INDEX[name]] = True
    for reader in pending:
        free[_INDEX[f"{reader}_missing"]] = False
        row[_INDEX[f"{reader}_missing"]] = 0.0
        for column in _READER_INCREASING:
            free[_INDEX[f"{reader}_{column}"]] = False
            row[_INDEX[f"{reader}_{column}"]] = float(end)
    for model in CTC_MODELS:
        if model in pending and model != engine:
            free[_INDEX[f"ctc_{model}_missing"]] = False
            row[_INDEX[f"ctc_{model}_missing"]] = 0.0
            for column in _CTC_INCREASING:
                free[_INDEX[f"ctc_{model}_{column}"]] = False
                row[_INDEX[f"ctc_{model}_{column}"]] = _CTC_RANGE[column][end]
    row[_INDEX["reread_count"]] = float(len(rereads_for(engine)))
    row[_INDEX["ctc_rival_gap"]] = -LOG_RATIO_CAP if favourable else LOG_RATIO_CAP
    for name in ("agree_len_logratio", "rereads_agree"):
        free[_INDEX[name]] = True
    return row, free


def optimistic(
    vector: np.ndarray, engine: str, pending: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A candidate's features before the re-reads of `pending` readers (default: every
    reader that would re-read it), with each of them agreeing: `vector` (computed without
    them) with each pending reader present, its `INCREASING` columns (agreement, character
    evidence, likelihoods) at their largest and the `DECREASING` rival at its least, and
    the mask of the columns whose most favourable value is unknown (a reader's confidence,
    the length ratio, whether two re-reads agree). The trees' `upper_raw` over that row
    bounds the score those re-reads could give the candidate: monotone constraints make
    larger increasing values never lower it."""
    readers = rereads_for(engine) if pending is None else tuple(pending)
    row, free = _bound_row(vector, engine, readers, favourable=True)
    for name in _AGREEMENT_INCREASING:
        row[_INDEX[name]] = 1.0
    return row, free


def pessimistic(
    vector: np.ndarray, engine: str, pending: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """The other side of `optimistic`: `vector` (computed without the `pending` readers)
    with each of them present and disagreeing as much as it can, and the mask of the
    columns left free. The trees' `lower_raw` over that row is the least score those
    re-reads could give: where it reaches the threshold, reading them cannot change the
    decision. Summaries over all re-reads take their least value given the readings
    already made (a maximum cannot fall, a minimum or an "all" can)."""
    row, free = _bound_row(vector, engine, pending, favourable=False)
    for name in ("reread_min_sim", "reread_all_exact", "agree_digits_equal"):
        row[_INDEX[name]] = 0.0
    return row, free


# Words a full stop ends as an abbreviation, after which a sentence goes on in lower case.
_ABBREVIATIONS = frozenset(
    {"al", "approx", "ca", "cf", "ed", "eds", "etc", "fig", "figs", "ibid", "incl", "no"}
    | {"nos", "pp", "resp", "vol", "vols", "vs", "viz"}
)
_STOP_LOWER = re.compile(r"([^\s.]+)\.\s+(?=[a-z])")


def stops_before_lowercase(text: str) -> int:
    """Full stops followed by a word in lower case, abbreviations aside: in print that is a
    comma whose tail the scan lost ("diagnosis. drug", "Thomas. and"). All three readers
    make this misreading together, sure of it, so no agreement or character evidence
    shows it; the text does."""
    return sum(
        1
        for match in _STOP_LOWER.finditer(text)
        if match.group(1).lower() not in _ABBREVIATIONS and len(match.group(1)) > 1
    )


def category_features(category: ir.Category) -> dict[str, float]:
    category = ir.Category(category)
    return {
        "category_formula": float(category == ir.Category.formula),
        "category_table": float(category == ir.Category.table),
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
    text: str,
    category: ir.Category,
    engine: str,
    confidence: float | None,
    rereads: dict[str, Reading],
    word_confidence: float | None = None,
    ctc: Mapping[str, CtcScores] | None = None,
) -> np.ndarray:
    """All features of one unit, in FEATURE_NAMES order. `rereads`: the independent
    readings of the crop by reader name, their texts as the engines gave them; `ctc`: the
    CTC models' scores of the crop by model name (the candidate's own engine's included:
    its evidence on its own reading)."""
    shown = visible_text(text, category)
    visible = {
        name: Reading(
            r.engine, visible_text(r.text, ir.Category.text), r.confidence, r.word_confidence
        )
        for name, r in rereads.items()
    }
    values: dict[str, float] = {}
    values.update(engine_features(engine, confidence, word_confidence))
    values.update(agreement_features(shown, visible))
    values.update(ctc_features(shown, ctc or {}, [r.text for r in visible.values()]))
    values["text_stop_lower"] = float(stops_before_lowercase(shown))
    values.update(category_features(category))
    return feature_vector(values)
