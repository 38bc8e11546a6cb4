"""A page's result in and out of the database. Saving replaces the page's previous result
row by row on natural keys, so a redelivered page leaves exactly what it produced: same
ids for what it produced again, nothing stale from a run that found more."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ocrfleet import ir
from ocrfleet.db.models import Candidate, Page, Region, Review, ReviewFlag, Score, User
from ocrfleet.db.upsert import upsert_many


def _repeats(keys: Iterable[Any]) -> list[Any]:
    return [key for key, count in Counter(keys).items() if count > 1]


def _check_result(result: ir.PageResult) -> None:
    """Refuse a result whose parts do not refer to each other; clearer than an FK error."""
    problems: list[str] = []
    numbers = {region.number for region in result.regions}
    candidates = {(c.region_number, c.engine) for c in result.candidates}
    if repeats := _repeats(region.number for region in result.regions):
        problems.append(f"region numbers repeat: {repeats}")
    if repeats := _repeats((c.region_number, c.engine) for c in result.candidates):
        problems.append(f"candidates (region, engine) repeat: {repeats}")
    if repeats := _repeats((s.region_number, s.engine, s.scorer) for s in result.scores):
        problems.append(f"scores (region, engine, scorer) repeat: {repeats}")
    if repeats := _repeats(d.region_number for d in result.decisions):
        problems.append(f"decisions repeat for regions {repeats}")
    if orphans := sorted({c.region_number for c in result.candidates} - numbers):
        problems.append(f"candidates for unknown regions {orphans}")
    if orphans := sorted({(s.region_number, s.engine) for s in result.scores} - candidates):
        problems.append(f"scores for unknown candidates {orphans}")
    if orphans := sorted({d.region_number for d in result.decisions} - numbers):
        problems.append(f"decisions for unknown regions {orphans}")
    for d in result.decisions:
        if d.chosen_engine is not None and (d.region_number, d.chosen_engine) not in candidates:
            problems.append(
                f"region {d.region_number} chooses engine {d.chosen_engine!r} without a candidate"
            )
    if problems:
        raise ValueError(f"inconsistent PageResult for page {result.page_number}: {problems}")


def _page_number(session: Session, page_id: int) -> int:
    number = session.execute(select(Page.number).where(Page.id == page_id)).scalar_one_or_none()
    if number is None:
        raise LookupError(f"page id {page_id} does not exist")
    return number


def _delete_stale(session: Session, page_id: int, result: ir.PageResult) -> None:
    """Drop rows of this page that the new result does not contain, children first (no
    reliance on ON DELETE CASCADE, which SQLite applies only with foreign_keys on)."""
    numbers = {region.number for region in result.regions}
    candidates = {(c.region_number, c.engine) for c in result.candidates}
    scores = {(s.region_number, s.engine, s.scorer) for s in result.scores}
    rows = session.execute(
        select(Region.id, Region.number, Candidate.id, Candidate.engine, Score.id, Score.scorer)
        .select_from(Region)
        .outerjoin(Candidate, Candidate.region_id == Region.id)
        .outerjoin(Score, Score.candidate_id == Candidate.id)
        .where(Region.page_id == page_id)
    ).all()
    stale_regions: set[int] = set()
    stale_candidates: set[int] = set()
    stale_scores: set[int] = set()
    for region_id, number, candidate_id, engine, score_id, scorer in rows:
        if number not in numbers:
            stale_regions.add(region_id)
        if candidate_id is not None and (number, engine) not in candidates:
            stale_candidates.add(candidate_id)
        if score_id is not None and (number, engine, scorer) not in scores:
            stale_scores.add(score_id)
    if stale_scores:
        session.execute(delete(Score).where(Score.id.in_(stale_scores)))
    if stale_candidates:
        session.execute(delete(Candidate).where(Candidate.id.in_(stale_candidates)))
    if stale_regions:
        session.execute(delete(Review).where(Review.region_id.in_(stale_regions)))
        session.execute(delete(ReviewFlag).where(ReviewFlag.region_id.in_(stale_regions)))
        session.execute(delete(Region).where(Region.id.in_(stale_regions)))


def save_page_result(session: Session, page_id: int, result: ir.PageResult) -> None:
    """Write everything one page produced; idempotent, so a redelivered page is harmless.

    Leaves the page row itself alone: marking it done is the caller's part of the same
    transaction. Open review flags exist afterwards exactly for the rejected regions (rule
    flags are the caller's to add again, in the same transaction); a resolved flag (staff
    work) is never deleted while its region exists.
    """
    _check_result(result)
    number = _page_number(session, page_id)
    if number != result.page_number:
        raise ValueError(
            f"page id {page_id} is page {number}, but the result is for page {result.page_number}"
        )
    _delete_stale(session, page_id, result)

    decisions = {d.region_number: d for d in result.decisions}
    upsert_many(
        session,
        Region,
        [
            {
                "page_id": page_id,
                "number": region.number,
                "category": region.category.value,
                "x0": region.bbox.x0,
                "y0": region.bbox.y0,
                "x1": region.bbox.x1,
                "y1": region.bbox.y1,
                "det_score": region.det_score,
                "block": region.block,
                "lines": [list(line.as_tuple()) for line in region.lines] or None,
                "chosen_engine": d.chosen_engine if (d := decisions.get(region.number)) else None,
                "accepted": d.accepted if d else None,
                "threshold": d.threshold if d else None,
            }
            for region in result.regions
        ],
        key=["page_id", "number"],
    )
    region_ids = dict(
        session.execute(select(Region.number, Region.id).where(Region.page_id == page_id)).all()
    )

    upsert_many(
        session,
        Candidate,
        [
            {
                "region_id": region_ids[c.region_number],
                "engine": c.engine,
                "text": c.text,
                "confidence": c.confidence,
                "error": c.error,
                "truncated": c.truncated,
                "read_as": c.read_as,
                "skipped": c.skipped or None,
                "words": [w.model_dump(mode="json") for w in c.words] if c.words else None,
            }
            for c in result.candidates
        ],
        key=["region_id", "engine"],
    )
    candidate_ids = {
        (number, engine): candidate_id
        for number, engine, candidate_id in session.execute(
            select(Region.number, Candidate.engine, Candidate.id)
            .join(Region, Region.id == Candidate.region_id)
            .where(Region.page_id == page_id)
        ).all()
    }

    upsert_many(
        session,
        Score,
        [
            {
                "candidate_id": candidate_ids[(s.region_number, s.engine)],
                "scorer": s.scorer,
                "scorer_version": s.scorer_version,
                "verdict": s.verdict.value,
                "score": s.score,
                "error": s.error,
            }
            for s in result.scores
        ],
        key=["candidate_id", "scorer"],
    )

    flagged = {
        (region_ids[d.region_number], d.flag_reason)
        for d in result.decisions
        if not d.accepted and d.flag_reason is not None
    }
    stale_flags = [
        flag_id
        for flag_id, region_id, reason in session.execute(
            select(ReviewFlag.id, ReviewFlag.region_id, ReviewFlag.reason).where(
                ReviewFlag.region_id.in_(region_ids.values()), ReviewFlag.status == "open"
            )
        ).all()
        if (region_id, reason) not in flagged
    ]
    if stale_flags:
        session.execute(delete(ReviewFlag).where(ReviewFlag.id.in_(stale_flags)))
    upsert_many(
        session,
        ReviewFlag,
        [{"region_id": region_id, "reason": reason} for region_id, reason in sorted(flagged)],
        key=["region_id", "reason"],
        update=[],
    )


def load_page_result(session: Session, page_id: int) -> ir.PageResult:
    """Read a page's result back; `load(save(r)) == r` for results saved once, because rows
    come back in id order, which is the order they were first saved in.

    Selects columns, not entities, so objects cached in the session cannot go stale here.
    """
    page_number = _page_number(session, page_id)
    regions = session.execute(
        select(
            Region.id,
            Region.number,
            Region.category,
            Region.x0,
            Region.y0,
            Region.x1,
            Region.y1,
            Region.det_score,
            Region.block,
            Region.lines,
            Region.chosen_engine,
            Region.accepted,
            Region.threshold,
        )
        .where(Region.page_id == page_id)
        .order_by(Region.id)
    ).all()
    candidates = session.execute(
        select(
            Candidate.id,
            Region.number,
            Candidate.engine,
            Candidate.text,
            Candidate.confidence,
            Candidate.error,
            Candidate.truncated,
            Candidate.read_as,
            Candidate.skipped,
            Candidate.words,
        )
        .join(Region, Region.id == Candidate.region_id)
        .where(Region.page_id == page_id)
        .order_by(Candidate.id)
    ).all()
    scores = session.execute(
        select(
            Region.number,
            Candidate.engine,
            Score.scorer,
            Score.scorer_version,
            Score.verdict,
            Score.score,
            Score.error,
        )
        .join(Candidate, Candidate.id == Score.candidate_id)
        .join(Region, Region.id == Candidate.region_id)
        .where(Region.page_id == page_id)
        .order_by(Score.id)
    ).all()
    # The policy's flag of each region; rule flags (`rule:<name>`) are not decisions.
    reasons = dict(
        session.execute(
            select(ReviewFlag.region_id, ReviewFlag.reason)
            .join(Region, Region.id == ReviewFlag.region_id)
            .where(Region.page_id == page_id, ReviewFlag.reason.not_like("rule:%"))
        ).all()
    )
    # Each region's latest review that decided something (later rows win in the dict).
    latest = {
        row.number: row
        for row in session.execute(
            select(
                Region.number,
                Review.action,
                Review.engine,
                Review.final_text,
                User.name,
                Review.created_at,
            )
            .join(Region, Region.id == Review.region_id)
            .join(User, User.id == Review.reviewer_id)
            .where(Region.page_id == page_id, Review.action != "skip")
            .order_by(Review.id)
        ).all()
    }

    decisions: list[ir.Decision] = []
    for region in regions:
        if region.accepted is None:
            continue
        if not region.accepted and region.id not in reasons:
            raise ValueError(
                f"region {region.number} of page id {page_id} is rejected but has no review flag"
            )
        decisions.append(
            ir.Decision(
                region_number=region.number,
                chosen_engine=region.chosen_engine,
                accepted=region.accepted,
                flag_reason=None if region.accepted else reasons[region.id],
                threshold=region.threshold,
            )
        )
    return ir.PageResult(
        page_number=page_number,
        regions=[
            ir.Region(
                number=region.number,
                category=ir.Category(region.category),
                bbox=ir.BBox(x0=region.x0, y0=region.y0, x1=region.x1, y1=region.y1),
                det_score=region.det_score,
                block=region.block,
                lines=[ir.BBox(x0=a, y0=b, x1=c, y1=d) for a, b, c, d in region.lines or []],
            )
            for region in regions
        ],
        candidates=[
            ir.Candidate(
                region_number=c.number,
                engine=c.engine,
                text=c.text,
                confidence=c.confidence,
                error=c.error,
                truncated=c.truncated,
                read_as=c.read_as,
                skipped=c.skipped or [],
                words=[ir.Word.model_validate(w) for w in c.words or ()],
            )
            for c in candidates
        ],
        scores=[
            ir.Score(
                region_number=s.number,
                engine=s.engine,
                scorer=s.scorer,
                scorer_version=s.scorer_version,
                verdict=ir.Verdict(s.verdict),
                score=s.score,
                error=s.error,
            )
            for s in scores
        ],
        decisions=decisions,
        reviews=[
            ir.Review(
                region_number=number,
                action=ir.ReviewAction(row.action),
                engine=row.engine,
                text=row.final_text or "",
                reviewer=row.name,
                reviewed_at=row.created_at,
            )
            for number, row in sorted(latest.items())
        ],
    )
