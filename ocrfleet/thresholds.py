"""How much text a threshold auto-accepts, and how much of the accepted text is right.

Choosing a threshold trades reviewer time (accept rate) against wrong text slipping through
(precision of the accepted units); this measures both on a labelled set so the choice is
made on numbers. A unit whose score is not `scored` is never accepted: it goes to review.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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
