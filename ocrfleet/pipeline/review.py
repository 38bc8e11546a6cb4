"""The review policy: which regions are auto-accepted and which go to a person, and why.

A score counts only when its verdict is `scored`: a region whose candidates could not be
scored goes to review with the verdict as its reason, never as if it had scored low.

Best-of-N never makes text worse on purpose: the primary engine's candidate (the first in
`OCRFLEET_ENGINES` that read the region and was scored) is kept unless another candidate's
score beats it by more than the policy's margin, a margin validated on held-back real
documents to lower CER. The chosen candidate is accepted when its score reaches the
threshold for its (engine, category); when no threshold kept its precision promise for that
kind, the region goes to review as `uncalibrated`. A chosen candidate under its threshold
goes to review even though it is the best we have; it is still chosen so the document text
is complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.pipeline.regions import crop
from ocrfleet.scorers import load_policy
from ocrfleet.scorers.base import Policy, Scorer, Unit
from ocrfleet.scorers.features import least_word_confidence

ENGINE_FAILED = "engine_failed"
NOT_SCORED = "not_scored"
ALL_BELOW = "all_candidates_below_threshold"
LOW_SCORE = "low_score"
MISSING_SCORE = "missing"  # a non-error candidate that the scorer returned nothing for
UNCALIBRATED = "uncalibrated"  # no threshold for this (engine, category) kept its promise
# Not re-read (verdict `bounded`) though a re-read could have lifted it to its threshold: the
# scorer's screen predicted it would stay under.
SCREENED = "screened"
ENGINE_TRUNCATED = "engine_truncated"  # the chosen reading stopped at the token limit
# The detector found text lines in the region, and the chosen reading is empty: accepting it
# would pass "nothing here" off as read.
EMPTY_READING = "empty_reading"
# A table or formula read line by line: no configured engine reads the block as a whole.
NO_BLOCK_ENGINE = {ir.Category.table: "no_table_engine", ir.Category.formula: "no_formula_engine"}


def score_units(
    page: Image.Image,
    regions: Sequence[ir.Region],
    candidates: Sequence[ir.Candidate],
    scorer: Scorer,
    policy: Policy | None = None,
) -> list[ir.Score]:
    """Score every non-error candidate in one batched call.

    Candidates of one region share one crop (same bounds), so their scores compare.
    Error candidates get no unit: `decide` routes them by their error. Given the `policy`
    that will decide the regions, a scorer that can (`score_against`) skips the work that
    cannot change a decision.
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
                word_confidence=least_word_confidence(candidate.words),
            )
        )
    if not units:
        return []
    score_against = getattr(scorer, "score_against", None)
    if policy is None or score_against is None:
        return scorer.score(units)
    return score_against(units, lambda unit: policy.threshold(unit.engine, unit.category))


def decide(
    regions: Sequence[ir.Region],
    candidates: Sequence[ir.Candidate],
    scores: Sequence[ir.Score],
    settings: Settings,
    policy: Policy | None = None,
) -> list[ir.Decision]:
    """One decision per region, in region order. `policy` defaults to the configured
    scorer's (`load_policy(settings)`)."""
    policy = load_policy(settings) if policy is None else policy
    score_of = {(score.region_number, score.engine): score for score in scores}
    decisions = []
    for region in regions:
        own = [c for c in candidates if c.region_number == region.number]
        # A figure: kept as an image; the text lines in it are regions of their own.
        if not region.category.has_text:
            decisions.append(
                ir.Decision(region_number=region.number, chosen_engine=None, accepted=True)
            )
            continue
        decision = _caveats(region, own, _decide_region(region, own, score_of, policy))
        if decision.chosen_engine is not None:
            threshold = policy.threshold(decision.chosen_engine, region.category)
            decision = decision.model_copy(update={"threshold": threshold})
        decisions.append(decision)
    return decisions


def _caveats(
    region: ir.Region, candidates: list[ir.Candidate], decision: ir.Decision
) -> ir.Decision:
    """A reading that is cut short or empty, or a block read as loose lines, goes to review
    with that as its reason however it scored: the score cannot see what is missing."""
    chosen = next((c for c in candidates if c.engine == decision.chosen_engine), None)
    if chosen is None:
        return decision
    reason = None
    if decision.accepted and not chosen.text.strip():
        reason = EMPTY_READING
    elif chosen.truncated:
        reason = ENGINE_TRUNCATED
    elif chosen.read_as is not None and region.category in NO_BLOCK_ENGINE:
        reason = NO_BLOCK_ENGINE[region.category]
    if reason is None:
        return decision
    return decision.model_copy(update={"accepted": False, "flag_reason": reason})


def choose(
    scored: Sequence[tuple[float, ir.Candidate]], margin: float
) -> tuple[float, ir.Candidate]:
    """The primary (first) candidate, unless the best other one beats its score by more
    than `margin`; ties among the others go to the earlier engine."""
    primary = scored[0]
    if len(scored) > 1:
        best = max(scored[1:], key=lambda pair: pair[0])
        if best[0] - primary[0] > margin:
            return best
    return primary


def _decide_region(
    region: ir.Region,
    candidates: list[ir.Candidate],
    score_of: dict[tuple[int, str], ir.Score],
    policy: Policy,
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
        if score is not None and score.verdict in ir.SCORING_VERDICTS and score.score is not None:
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
    best_score, best = choose(scored, policy.margin)
    threshold = policy.threshold(best.engine, region.category)
    if threshold is None:
        return ir.Decision(
            region_number=region.number,
            chosen_engine=best.engine,
            accepted=False,
            flag_reason=UNCALIBRATED,
        )
    bounded = score_of[(region.number, best.engine)].verdict == ir.Verdict.bounded
    if best_score >= threshold and not bounded:
        return ir.Decision(region_number=region.number, chosen_engine=best.engine, accepted=True)
    below = ALL_BELOW if len(scored) > 1 else LOW_SCORE
    # a bound at or over the threshold: the region was screened, not verified
    reason = SCREENED if best_score >= threshold else below
    return ir.Decision(
        region_number=region.number,
        chosen_engine=best.engine,
        accepted=False,
        flag_reason=reason,
    )
