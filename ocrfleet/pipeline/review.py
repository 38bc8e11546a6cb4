"""The review policy: which regions are auto-accepted and which go to a person, and why.

A score counts only when its verdict is `scored`: a region whose candidates could not be
scored goes to review with the verdict as its reason, never as if it had scored low. When
every scored candidate is under the threshold the region goes to review even though one of
them is the best we have; that best one is still chosen so the document text is complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.pipeline.regions import crop
from ocrfleet.scorers.base import Scorer, Unit

ENGINE_FAILED = "engine_failed"
NOT_SCORED = "not_scored"
ALL_BELOW = "all_candidates_below_threshold"
LOW_SCORE = "low_score"
MISSING_SCORE = "missing"  # a non-error candidate that the scorer returned nothing for
ENGINE_TRUNCATED = "engine_truncated"  # the chosen reading stopped at the token limit
# A table or formula read line by line: no configured engine reads the block as a whole.
NO_BLOCK_ENGINE = {ir.Category.table: "no_table_engine", ir.Category.formula: "no_formula_engine"}


def score_units(
    page: Image.Image,
    regions: Sequence[ir.Region],
    candidates: Sequence[ir.Candidate],
    scorer: Scorer,
) -> list[ir.Score]:
    """Score every non-error candidate in one batched call.

    Candidates of one region share one crop (same bounds), so their scores compare.
    Error candidates get no unit: `decide` routes them by their error.
    """
    by_number = {region.number: region for region in regions}
    crops: dict[int, Image.Image] = {}
    units: list[Unit] = []
    for candidate in candidates:
        if candidate.error is not None:
            continue
        region = by_number.get(candidate.region_number)
        if region is None:
            raise ValueError(
                f"candidate from {candidate.engine} names region {candidate.region_number}, "
                f"which is not on this page"
            )
        if region.number not in crops:
            crops[region.number] = crop(page, region.bbox)
        units.append(
            Unit(
                crop=crops[region.number],
                text=candidate.text,
                category=region.category.scored_as,
                region_number=region.number,
                engine=candidate.engine,
                confidence=candidate.confidence,
            )
        )
    if not units:
        return []
    return scorer.score(units)


def decide(
    regions: Sequence[ir.Region],
    candidates: Sequence[ir.Candidate],
    scores: Sequence[ir.Score],
    settings: Settings,
) -> list[ir.Decision]:
    """One decision per region, in region order."""
    score_of = {(score.region_number, score.engine): score for score in scores}
    decisions = []
    for region in regions:
        own = [c for c in candidates if c.region_number == region.number]
        if not region.category.has_text:  # a figure: kept, nothing to read or check
            decisions.append(
                ir.Decision(region_number=region.number, chosen_engine=None, accepted=True)
            )
            continue
        decision = _decide_region(region, own, score_of, settings.threshold(region.category))
        decisions.append(_caveats(region, own, decision))
    return decisions


def _caveats(
    region: ir.Region, candidates: list[ir.Candidate], decision: ir.Decision
) -> ir.Decision:
    """A reading that is cut short, or a block read as loose lines, goes to review with that
    as its reason however it scored: the score cannot see what is missing."""
    chosen = next((c for c in candidates if c.engine == decision.chosen_engine), None)
    if chosen is None:
        return decision
    reason = None
    if chosen.truncated:
        reason = ENGINE_TRUNCATED
    elif chosen.read_as is not None and region.category in NO_BLOCK_ENGINE:
        reason = NO_BLOCK_ENGINE[region.category]
    if reason is None:
        return decision
    return decision.model_copy(update={"accepted": False, "flag_reason": reason})


def _decide_region(
    region: ir.Region,
    candidates: list[ir.Candidate],
    score_of: dict[tuple[int, str], ir.Score],
    threshold: float,
) -> ir.Decision:
    readable = [c for c in candidates if c.error is None]
    if not readable:
        return ir.Decision(
            region_number=region.number,
            chosen_engine=None,
            accepted=False,
            flag_reason=ENGINE_FAILED,
        )
    scored: list[tuple[float, ir.Candidate]] = []
    for candidate in readable:
        score = score_of.get((region.number, candidate.engine))
        if score is not None and score.verdict == ir.Verdict.scored and score.score is not None:
            scored.append((score.score, candidate))
    if not scored:
        first = score_of.get((region.number, readable[0].engine))
        verdict = first.verdict.value if first is not None else MISSING_SCORE
        return ir.Decision(
            region_number=region.number,
            chosen_engine=readable[0].engine,
            accepted=False,
            flag_reason=f"{NOT_SCORED}:{verdict}",
        )
    # max() keeps the first of equal scores, so ties go to the earlier engine in the list.
    best_score, best = max(scored, key=lambda pair: pair[0])
    if best_score >= threshold:
        return ir.Decision(region_number=region.number, chosen_engine=best.engine, accepted=True)
    return ir.Decision(
        region_number=region.number,
        chosen_engine=best.engine,
        accepted=False,
        flag_reason=ALL_BELOW if len(scored) > 1 else LOW_SCORE,
    )
