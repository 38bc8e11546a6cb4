"""A reviewer's decision, recorded: a `reviews` row, the region's open flags closed, and
the document `reviewed` once none of its flags is open. Nothing is overwritten: the
candidates stay as the engines read them, and the final text lives in the review."""

from __future__ import annotations

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from ocrfleet import ir
from ocrfleet.db.models import Candidate, Document, Page, Region, Review, ReviewFlag, utcnow
from ocrfleet.review.queue import scoped
from ocrfleet.review.users import Account


class ReviewRefused(ValueError):
    """The decision cannot be recorded as given (bad action, unknown engine, no text)."""


class ClaimedByOther(RuntimeError):
    """Someone else holds the region's claim."""


def record_review(
    session: Session,
    account: Account,
    region_id: int,
    action: ir.ReviewAction,
    *,
    engine: str | None = None,
    text: str | None = None,
) -> Review:
    """Record one decision on a region the account can see (LookupError otherwise)."""
    document_id = session.scalar(
        scoped(
            select(Document.id)
            .join(Page, Page.document_id == Document.id)
            .join(Region, Region.page_id == Page.id)
            .where(Region.id == region_id),
            account,
        )
    )
    if document_id is None:
        raise LookupError(f"no region {region_id}")
    now = utcnow()
    open_flags = session.execute(
        select(ReviewFlag.id, ReviewFlag.claimed_by, ReviewFlag.claimed_until)
        .where(ReviewFlag.region_id == region_id, ReviewFlag.status == "open")
        .order_by(ReviewFlag.id)
        .with_for_update()
    ).all()
    for _, holder, until in open_flags:
        if holder is not None and holder != account.id and until is not None and until > now:
            raise ClaimedByOther(f"region {region_id} is claimed by another reviewer")
    flag_id = open_flags[0].id if open_flags else None

    final_text = _final_text(session, region_id, action, engine, text)
    review = Review(
        region_id=region_id,
        flag_id=flag_id,
        reviewer_id=account.id,
        action=action.value,
        engine=engine if action == ir.ReviewAction.accept else None,
        final_text=final_text,
        created_at=now,
    )
    session.add(review)
    if action == ir.ReviewAction.skip:
        session.execute(
            update(ReviewFlag)
            .where(ReviewFlag.region_id == region_id, ReviewFlag.claimed_by == account.id)
            .values(claimed_by=None, claimed_until=None)
        )
        session.flush()
        return review
    session.execute(
        update(ReviewFlag)
        .where(ReviewFlag.region_id == region_id, ReviewFlag.status == "open")
        .values(status="resolved", resolved_text=final_text, claimed_by=None, claimed_until=None)
    )
    session.flush()
    _mark_reviewed(session, document_id)
    return review


def _final_text(
    session: Session,
    region_id: int,
    action: ir.ReviewAction,
    engine: str | None,
    text: str | None,
) -> str | None:
    if action == ir.ReviewAction.accept:
        row = session.execute(
            select(Candidate.text, Candidate.error).where(
                Candidate.region_id == region_id, Candidate.engine == (engine or "")
            )
        ).one_or_none()
        if row is None or row.error is not None:
            raise ReviewRefused(f"region {region_id} has no readable candidate from {engine!r}")
        return row.text
    if action == ir.ReviewAction.correct:
        corrected = (text or "").strip()
        if not corrected:
            raise ReviewRefused("a correction needs the text; use unreadable for none")
        return corrected
    if action == ir.ReviewAction.unreadable:
        return ""
    return None  # skip decides nothing


def _mark_reviewed(session: Session, document_id: int) -> None:
    """A finished document with no open flag left becomes `reviewed`."""
    still_open = (
        exists()
        .where(ReviewFlag.status == "open")
        .where(ReviewFlag.region_id == Region.id)
        .where(Region.page_id == Page.id)
        .where(Page.document_id == document_id)
    )
    session.execute(
        update(Document)
        .where(
            Document.id == document_id,
            Document.status == ir.DocumentStatus.done.value,
            ~still_open,
        )
        .values(status=ir.DocumentStatus.reviewed.value)
    )
