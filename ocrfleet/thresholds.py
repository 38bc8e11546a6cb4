"""How much text a threshold auto-accepts, and how much of the accepted text is right.

Choosing a threshold trades reviewer time (accept rate) against wrong text slipping through
(precision of the accepted units); this measures both on a labelled set so the choice is
made on numbers. A unit whose score is not `scored` is never accepted: it goes to review.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.scorers.base import Scorer, Unit

DEFAULT_THRESHOLDS = tuple(round(i / 20, 2) for i in range(21))


class Row(NamedTuple):
    threshold: float
    accept_rate: float  # accepted / all units
    precision: float | None  # correct / accepted; None when nothing is accepted
    n_accepted: int
    lower_bound: float | None = None  # precision's Clopper-Pearson 95% lower bound


@dataclass(frozen=True)
class Example:
    unit: Unit
    label: bool  # True when the text is exactly what the crop shows


def threshold_table(
    labels: Sequence[bool],
    scores: Sequence[float | None],
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
) -> list[Row]:
    """One row per threshold; a unit is accepted when its score >= threshold.

    A `None` score (not scored) is never accepted but still counts in the accept rate,
    because that unit costs a review like any other.
    """
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
    total = len(labels)
    rows = []
    for threshold in thresholds:
        accepted = [
            label
            for label, score in zip(labels, scores, strict=True)
            if score is not None and score >= threshold
        ]
        n_accepted = len(accepted)
        rows.append(
            Row(
                threshold=float(threshold),
                accept_rate=n_accepted / total if total else 0.0,
                precision=sum(accepted) / n_accepted if n_accepted else None,
                n_accepted=n_accepted,
                lower_bound=clopper_pearson(sum(accepted), n_accepted)[0] if n_accepted else None,
            )
        )
    return rows


def auroc(labels: Sequence[bool], scores: Sequence[float | None]) -> float:
    """Area under the ROC curve: the chance a correct unit outscores a wrong one (ties
    count half). A `None` score ranks below every real score."""
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
    floor = min((s for s in scores if s is not None), default=0.0) - 1.0
    values = np.array([floor if s is None else float(s) for s in scores], dtype=np.float64)
    positive = np.array(labels, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUROC needs both correct and wrong units")
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    start = 0
    while start < len(values):  # average ranks over ties
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def best_accept_rate(
    labels: Sequence[bool], scores: Sequence[float | None], min_precision: float
) -> Row | None:
    """The row with the highest accept rate whose precision is at least `min_precision`,
    over every distinct score as threshold; None when no threshold reaches it."""
    candidates = sorted({s for s in scores if s is not None})
    rows = threshold_table(labels, scores, candidates)
    good = [row for row in rows if row.precision is not None and row.precision >= min_precision]
    return max(good, key=lambda row: (row.accept_rate, -row.threshold), default=None)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval for a proportion of k in n: the p
    where P(X >= k) and P(X <= k) equal (1 - confidence) / 2. Bisection on the binomial
    tail, so no statistics package is needed."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2
    lower = 0.0 if k == 0 else _bisect(lambda p: _at_least(k, n, p) - tail)
    upper = 1.0 if k == n else _bisect(lambda p: _at_least(k + 1, n, p) - (1.0 - tail))
    return lower, upper


def _at_least(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space."""
    if p <= 0.0:
        return 0.0 if k > 0 else 1.0
    if p >= 1.0:
        return 1.0
    i = np.arange(k, n + 1, dtype=np.float64)
    log_pmf = _log_choose(n)[k:] + i * math.log(p) + (n - i) * math.log1p(-p)
    top = float(log_pmf.max())
    return float(min(1.0, math.exp(top) * np.exp(log_pmf - top).sum()))


@lru_cache(maxsize=64)
def _log_choose(n: int) -> np.ndarray:
    """log C(n, i) for i = 0..n."""
    steps = np.log(np.arange(n, 0, -1, dtype=np.float64)) - np.log(np.arange(1, n + 1))
    return np.concatenate([[0.0], np.cumsum(steps)])


def _bisect(increasing, lo: float = 0.0, hi: float = 1.0, steps: int = 60) -> float:
    """The root of a function that increases over [lo, hi]."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if increasing(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Choice:
    threshold: float
    n_accepted: int
    n_correct: int
    accept_rate: float
    precision: float
    lower_bound: float  # Clopper-Pearson 95%, two-sided


def choose_threshold(
    labels: Sequence[bool], scores: Sequence[float | None], min_lower: float = 0.99
) -> Choice | None:
    """The lowest threshold (a distinct score) whose precision's Clopper-Pearson 95% lower
    bound is >= `min_lower`; None when none is. Thresholds whose point precision is below
    the target cannot pass and are skipped without computing a bound."""
    pairs = sorted(
        ((float(s), bool(label)) for label, s in zip(labels, scores, strict=True) if s is not None),
        key=lambda pair: -pair[0],
    )
    total = len(labels)
    options: list[tuple[float, int, int]] = []  # (threshold, accepted, correct), high first
    k = 0
    for index, (score, label) in enumerate(pairs):
        k += label
        if index + 1 == len(pairs) or pairs[index + 1][0] != score:
            options.append((score, index + 1, k))
    for threshold, n, k in reversed(options):  # lowest threshold first
        if k / n < min_lower:
            continue
        lower = clopper_pearson(k, n)[0]
        if lower >= min_lower:
            return Choice(threshold, n, k, n / total, k / n, lower)
    return None


def load_dataset(path: Path) -> list[Example]:
    """A labelled JSONL set: one {"crop", "text", "category", "label"} object a line.

    `crop` is an image path relative to the JSONL file; `label` is 1 when `text` is
    exactly the crop's content.
    """
    from ocrfleet.pipeline.images import load_image

    path = Path(path)
    examples = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                crop_path = path.parent / record["crop"]
                label = record["label"]
                if label not in (0, 1, True, False):
                    raise ValueError(f"label must be 0 or 1, not {label!r}")
                unit = Unit(
                    crop=load_image(crop_path.read_bytes()),
                    text=str(record["text"]),
                    category=ir.Category(record.get("category", "text")),
                    region_number=line_no,
                    engine=str(record.get("engine", "dataset")),
                    confidence=record.get("confidence"),
                    word_confidence=record.get("word_confidence"),
                )
            except (KeyError, ValueError, OSError) as error:
                raise ValueError(f"{path}:{line_no}: bad example: {error}") from error
            examples.append(Example(unit=unit, label=bool(label)))
    return examples


def score_dataset(dataset: Sequence[Example], scorer: Scorer) -> list[ir.Score]:
    """All units in one batched call, one Score per example in order."""
    if not dataset:
        return []
    return scorer.score([example.unit for example in dataset])


def run_thresholds(
    path: Path, settings: Settings, thresholds: Sequence[float] = DEFAULT_THRESHOLDS
) -> list[Row]:
    """Score a labelled set with the configured scorer and tabulate the thresholds."""
    from ocrfleet.scorers import load_scorer

    dataset = load_dataset(path)
    scores = score_dataset(dataset, load_scorer(settings))
    return threshold_table(
        [example.label for example in dataset],
        [score.score if score.verdict == ir.Verdict.scored else None for score in scores],
        thresholds,
    )


def shipped_threshold_lines(settings: Settings) -> list[str]:
    """The consensus calibration's thresholds with the evidence they were chosen on."""
    if settings.scorer != "consensus":
        return []
    from ocrfleet.scorers.consensus import weights_path

    raw = json.loads(weights_path(settings).read_text(encoding="utf-8"))
    evidence = raw["training"]["threshold_evidence"]
    lines = []
    for engine, by_category in raw["thresholds"].items():
        for category, threshold in by_category.items():
            if threshold is None:
                lines.append(f"shipped {engine}/{category}: uncalibrated (goes to review)")
                continue
            info = evidence.get(engine, {}) if category == "text" else {}
            lines.append(
                f"shipped {engine}/{category}: threshold {threshold:.4f}, held-back precision "
                f"{info.get('precision')} (95% lower bound {info.get('lower_bound_95')}) on "
                f"{info.get('accepted')} accepted of {info.get('of')}"
            )
    screen = raw["training"]["screen"]
    for engine, by_set in screen["by_set"].items():
        candidates = sum(item["candidates"] for item in by_set.values())
        skipped = sum(item["screened"] for item in by_set.values())
        accepted = sum(item["accepted"] for item in by_set.values())
        lost = sum(item["accepted_screened"] for item in by_set.values())
        lines.append(
            f"shipped screen {engine}: not re-read {skipped / max(candidates, 1):.1%} of "
            f"{candidates} held-back candidates, {lost} of their {accepted} accepted "
            f"(target <= {screen['loss_target']:.0%})"
        )
    second = raw["training"].get("second", {})
    lazy = "+".join(second.get("lazy", ()))
    for engine, by_set in second.get("by_set", {}).items():
        candidates = sum(item["candidates"] for item in by_set.values())
        unread = sum(item["accepted_unread"] + item["review_unread"] for item in by_set.values())
        path = second["threshold_evidence"][engine]["path"]
        lines.append(
            f"shipped second stage {engine}: decided without {lazy} "
            f"{unread / max(candidates, 1):.1%} of {candidates} held-back candidates; the path "
            f"accepts {path['accepted']} at precision {path['precision']} (95% lower bound "
            f"{path['lower_bound_95']})"
        )
    early = raw["training"].get("early", {})
    for engine, by_set in early.get("by_set", {}).items():
        candidates = sum(item["candidates"] for item in by_set.values())
        accepted = sum(item["accepted_early"] for item in by_set.values())
        path = early["threshold_evidence"][engine]["path"]
        lines.append(
            f"shipped early accept {engine}: accepted before any re-read "
            f"{accepted / max(candidates, 1):.1%} of {candidates} held-back candidates; the "
            f"path accepts {path['accepted']} at precision {path['precision']} (95% lower "
            f"bound {path['lower_bound_95']})"
        )
    return lines


def plot(rows: Sequence[Row], path: Path) -> None:
    """Accept rate and precision against threshold, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thresholds = [row.threshold for row in rows]
    figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
    axes.plot(thresholds, [row.accept_rate for row in rows], marker="o", label="accept rate")
    with_precision = [row for row in rows if row.precision is not None]
    axes.plot(
        [row.threshold for row in with_precision],
        [row.precision for row in with_precision],
        marker="s",
        label="precision of accepted",
    )
    axes.set_xlabel("threshold")
    axes.set_ylim(0.0, 1.02)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower left")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
