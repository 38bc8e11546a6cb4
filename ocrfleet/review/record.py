"""A reviewer's decision, recorded: a `reviews` row, the region's open flags closed, and
the document `reviewed` once none of its flags is open. Nothing is overwritten: the
candidates stay as the engines read them, and the final text lives in the review.

A decision names the version it was made against (the id of the region's latest decision
when the reviewer saw it, 0 for none); if another decision came in since, it is refused
with that decision, never silently replaced. Only an admin decides a region that has no
open flag (accepted automatically, or decided already) or that someone else decided; the
override names the decision it replaces and both stay in the history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from ocrfleet import ir, states
from ocrfleet.db.models import (
    Candidate,
    Document,
    Page,
    Region,
    Review,
    ReviewFlag,
    User,
    utcnow,
)
from ocrfleet.review.queue import aware, scoped
from ocrfleet.review.users import Account
from ocrfleet.webhooks import notify_reviewed

# Why a decision was refused, by code: the page shows the fixed message of a code it is
# handed, never text from the request.
REFUSALS = {
    "no_candidate": "That engine has no readable candidate for this region.",
    "no_text": "A correction needs the text; use unreadable for none.",
    "bad_text": "A correction has at most 100,000 characters and no NUL character.",
    "stale": "This region changed since it was shown; look at it again.",
}
MAX_TEXT = 100_000  # characters of a correction


class ReviewRefused(ValueError):
    """The decision cannot be recorded as given (unknown engine, no text); `code` is a key
    of REFUSALS."""

    def __init__(self, code: str) -> None:
        super().__init__(REFUSALS[code])
        self.code = code


class ClaimedByOther(RuntimeError):
    """Someone else holds the region's claim."""


class AdminOnly(PermissionError):
    """Only an admin may override an automatic acceptance or another's decision."""


@dataclass(frozen=True)
class Decision:
    """A recorded decision, as a conflict shows it."""

    id: int
    reviewer_id: int
    reviewer: str
    action: str
    text: str | None
    at: datetime


class Conflict(RuntimeError):
    """Another decision came in after the version the reviewer saw."""

    def __init__(self, current: Decision) -> None:
        super().__init__(f"{current.reviewer} decided this region first ({current.action})")
        self.current = current


def current_decision(session: Session, region_id: int) -> Decision | None:
    """The region's latest decision (skips decide nothing); its id is the region's version."""
    row = session.execute(
        select(Review.id, User.id, User.name, Review.action, Review.final_text, Review.created_at)
        .join(User, User.id == Review.reviewer_id)
        .where(Review.region_id == region_id, Review.action != "skip")
        .order_by(Review.id.desc())
        .limit(1)
    ).one_or_none()
    return Decision(*row) if row else None


def record_review(
    session: Session,
    account: Account,
    region_id: int,
    action: ir.ReviewAction,
    *,
    engine: str | None = None,
    text: str | None = None,
    version: int | None = None,
) -> Review:
    """Record one decision on a region the account can see (LookupError otherwise), made
    against `version` (see the module docstring; None: against whatever is current, for
    scripts). Raises Conflict, AdminOnly, ClaimedByOther or ReviewRefused."""
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
    # One decision on a region at a time: the version check and the write are atomic.
    session.execute(select(Region.id).where(Region.id == region_id).with_for_update())
    now = utcnow()
    open_flags = session.execute(
        select(ReviewFlag.id, ReviewFlag.claimed_by, ReviewFlag.claimed_until)
        .where(ReviewFlag.region_id == region_id, ReviewFlag.status == "open")
        .order_by(ReviewFlag.id)
        .with_for_update()
    ).all()
    for _, holder, until in open_flags:
        if holder is not None and holder != account.id and until and aware(until) > now:
            raise ClaimedByOther(f"region {region_id} is claimed by another reviewer")
    flag_id = open_flags[0].id if open_flags else None
    current = current_decision(session, region_id)
    if version is not None and version != (current.id if current else 0):
        if current is None:
            raise ReviewRefused("stale")
        raise Conflict(current)
    overriding = not open_flags or (current is not None and current.reviewer_id != account.id)
    if overriding and not account.is_admin:
        raise AdminOnly(
            f"region {region_id} is decided already"
            + (f" by {current.reviewer}" if current else " (accepted automatically)")
            + ": only an admin may override"
        )

    final_text = _final_text(session, region_id, action, engine, text)
    review = Review(
        region_id=region_id,
        flag_id=flag_id,
        reviewer_id=account.id,
        action=action.value,
        engine=engine if action == ir.ReviewAction.accept else None,
        final_text=final_text,
        created_at=now,
        overrides_id=current.id if current and action != ir.ReviewAction.skip else None,
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
    notify_reviewed(session, review)  # a `reviewed` webhook once this commits, if text changed
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
            raise ReviewRefused("no_candidate")
        return row.text
    if action == ir.ReviewAction.correct:
        corrected = (text or "").strip()
        if len(corrected) > MAX_TEXT or "\x00" in corrected:
            raise ReviewRefused("bad_text")
        if not corrected:
            raise ReviewRefused("no_text")
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
    states.move(
        session, Document, ir.DocumentStatus.reviewed, Document.id == document_id, ~still_open
    )
