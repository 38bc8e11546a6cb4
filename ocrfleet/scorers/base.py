"""The scorer interface: every verifier judges (crop, candidate text, category) units in
batches and returns one `Score` per unit, with a verdict that says whether it really ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from PIL import Image

from ocrfleet import ir


@dataclass(frozen=True)
class Unit:
    """One evaluation unit: a region crop and one candidate's reading of it."""

    crop: Image.Image
    text: str
    category: ir.Category
    region_number: int
    engine: str
    confidence: float | None = None  # the candidate engine's own confidence in [0, 1], if any
    # Its least confident word's confidence, where the engine gives words: one doubtful
    # character shows there, while the line's mean hides it.
    word_confidence: float | None = None


class Scorer(Protocol):
    name: str
    version: str  # enters run_id: model revision, renderer version, calibration hash

    def score(self, units: list[Unit]) -> list[ir.Score]:
        """One Score per unit, in order. Never raises for a bad unit: that is a verdict."""
        ...


def judgement(
    scorer: Scorer,
    unit: Unit,
    verdict: ir.Verdict,
    *,
    score: float | None = None,
    error: str | None = None,
) -> ir.Score:
    """The Score a scorer gives a unit: the one place a Score is made from a Unit."""
    return ir.Score(
        region_number=unit.region_number,
        engine=unit.engine,
        scorer=scorer.name,
        scorer_version=scorer.version,
        verdict=verdict,
        score=score,
        error=error,
    )
