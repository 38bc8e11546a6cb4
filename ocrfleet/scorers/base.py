"""The scorer interface: every verifier judges (crop, candidate text, category) units in
batches and returns one `Score` per unit, with a verdict that says whether it really ran,
and brings its own `Policy` (thresholds and best-of-N margin) so the review routing never
needs to know which scorer produced the scores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings


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


@dataclass(frozen=True)
class Policy:
    """How a scorer's scores become decisions. Thresholds by (engine, category): `fixed` (a
    category's setting) applies to every engine; otherwise `per_engine` decides, its OTHER
    key standing for engines it does not name; a None threshold means uncalibrated. `margin`
    is the best-of-N margin."""

    fixed: dict[str, float | None] = field(default_factory=dict)
    per_engine: dict[str, dict[str, float | None]] = field(default_factory=dict)
    margin: float = 0.0

    OTHER = "other"

    def threshold(self, engine: str, category: str) -> float | None:
        # Titles, headers and the like are judged as text.
        category = ir.Category(str(getattr(category, "value", category))).scored_as.value
        if self.fixed.get(category) is not None:
            return self.fixed[category]
        by_category = self.per_engine.get(engine, self.per_engine.get(self.OTHER, {}))
        return by_category.get(category)


def settings_thresholds(settings: Settings) -> dict[str, float | None]:
    """The thresholds the settings fix per category (None: the scorer's policy decides)."""
    return {category.value: settings.threshold(category.value) for category in ir.Category}


class Scorer(Protocol):
    """A verifier. Its module also provides `policy(settings) -> Policy`, which
    `ocrfleet.scorers.load_policy` calls without loading a model."""

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
