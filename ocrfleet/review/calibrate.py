"""Thresholds from reviews: the reviewers' decisions are the labels. For each category,
accept rate against precision of what a threshold would have auto-accepted among the
reviewed regions, and the threshold that accepts most at a target precision.

Reviewed regions are mostly the ones the policy doubted, so they under-represent easy
text: the accept rates here are for that population, and the proposal is conservative."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ocrfleet import ir
from ocrfleet.review.reviewed import ReviewedRegion
from ocrfleet.thresholds import DEFAULT_THRESHOLDS, Row, best_accept_rate, threshold_table


@dataclass(frozen=True)
class Proposal:
    category: str
    regions: int
    correct: int  # regions whose chosen candidate the reviewer settled on as is
    rows: list[Row]
    proposed: Row | None  # None: no threshold reaches the target precision
    target: float


def labelled(regions: Sequence[ReviewedRegion]) -> tuple[list[bool], list[float | None]]:
    """(label, score) of each region's chosen candidate; an unscored one has no score. A
    `bounded` one counts at its ceiling: a threshold under the ceiling may or may not have
    accepted it, and counting it accepted (these are mostly regions the policy doubted)
    errs towards a lower precision, so towards proposing a higher threshold."""
    labels: list[bool] = []
    scores: list[float | None] = []
    for region in regions:
        chosen = region.chosen
        labels.append(chosen is not None and region.usable(chosen))
        scored = chosen is not None and chosen.verdict in ir.SCORING_VERDICTS
        scores.append(chosen.score if scored and chosen is not None else None)
    return labels, scores


def propose(
    regions: Sequence[ReviewedRegion],
    target: float,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
) -> list[Proposal]:
    """One proposal per category present, in category order."""
    proposals = []
    for category in sorted({region.category for region in regions}):
        own = [region for region in regions if region.category == category]
        labels, scores = labelled(own)
        proposals.append(
            Proposal(
                category=category,
                regions=len(own),
                correct=sum(labels),
                rows=threshold_table(labels, scores, thresholds),
                proposed=best_accept_rate(labels, scores, target),
                target=target,
            )
        )
    return proposals
