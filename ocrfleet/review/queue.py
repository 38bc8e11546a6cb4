"""What reviewers see: the open flags in order, one region with everything about it, one
document with the state of each region. Every query is scoped to the account's tenant, so
a region outside it reads exactly like one that does not exist."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, case, exists, func, or_, select, update
from sqlalchemy.orm import Session

from ocrfleet.db.models import (
    Candidate,
    Document,
    Page,
    Region,
    Review,
    ReviewFlag,
    Score,
    User,
    utcnow,
)
from ocrfleet.review.users import GLOBAL, Account

# Interactive uploads first, then oldest first.
PRIORITY_RANK = case((Document.priority == "high", 0), else_=1)
MAX_ID = 2**63 - 1  # the largest id a BIGINT column holds
MAX_FILTER = 200  # characters of a text filter


def aware(value: datetime) -> datetime:
    """A stored time in UTC: SQLite hands it back naive."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class BadFilter(ValueError):
    """A filter value the queue cannot take; the message is one line for a 400."""


def parse_id(value: object) -> int | None:
    """A row id from client text: ASCII digits within BIGINT's range, else None (so `²`,
    `-1`, `1e3` and 2**64 are no id rather than an error further down)."""
    if isinstance(value, int):
        return value if 0 < value <= MAX_ID else None
    if not isinstance(value, str) or not value.isascii() or not value.isdigit():
        return None
    if len(value) > 19:
        return None
    number = int(value)
    return number if 0 < number <= MAX_ID else None


def _text_filter(params: Any, name: str) -> str | None:
    value = params.get(name) or None
    if value is None:
        return None
    if len(value) > MAX_FILTER or not value.isprintable():
        raise BadFilter(f"filter {name}: at most {MAX_FILTER} printable characters")
    return value


@dataclass(frozen=True)
class Filters:
    reason: str | None = None
    category: str | None = None
    document: int | None = None
    run: str | None = None
    tenant: str | None = None

    @classmethod
    def from_query(cls, params: Any) -> Filters:
        """The filters of a query string; BadFilter for a value no row can match."""
        document = params.get("document") or None
        if document is not None and parse_id(document) is None:
            raise BadFilter(f"filter document: a document id (1 to {MAX_ID})")
        return cls(
            reason=_text_filter(params, "reason"),
            category=_text_filter(params, "category"),
            document=parse_id(document) if document else None,
            run=_text_filter(params, "run"),
            tenant=_text_filter(params, "tenant"),
        )

    def as_query(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items() if v is not None}


def scoped(stmt: Select[Any], account: Account) -> Select[Any]:
    """Limit a statement that joins Document to what the account may see: one tenant's
    documents, every tenant's for a global account, else only those without a tenant."""
    if account.tenant == GLOBAL:
        return stmt
    return stmt.where(Document.tenant == (account.tenant or ""))


def _flag_rows(account: Account, filters: Filters, *columns: Any) -> Select[Any]:
    stmt = (
        select(*columns)
        .select_from(ReviewFlag)
        .join(Region, Region.id == ReviewFlag.region_id)
        .join(Page, Page.id == Region.page_id)
        .join(Document, Document.id == Page.document_id)
        .where(ReviewFlag.status == "open")
    )
    if filters.category:
        stmt = stmt.where(Region.category == filters.category)
    if filters.document is not None:
        stmt = stmt.where(Document.id == filters.document)
    if filters.run:
        stmt = stmt.where(Document.run_id == filters.run)
    if filters.tenant:
        stmt = stmt.where(Document.tenant == filters.tenant)
    return scoped(stmt, account)


@dataclass(frozen=True)
class QueueRow:
    flag_id: int
    reason: str
    detail: str | None
    created_at: datetime
    region_id: int
    region_number: int
    category: str
    page_number: int
    document_id: int
    source_uri: str
    priority: str
    tenant: str  # "" for none
    claimed_by: str | None


def open_flags(
    session: Session, account: Account, filters: Filters, limit: int = 100
) -> list[QueueRow]:
    """Open flags, interactive documents first, then oldest first."""
    claimer = User.__table__.alias("claimer")
    now = utcnow()
    stmt = _flag_rows(
        account,
        filters,
        ReviewFlag.id,
        ReviewFlag.reason,
        ReviewFlag.detail,
        ReviewFlag.created_at,
        Region.id,
        Region.number,
        Region.category,
        Page.number,
        Document.id,
        Document.source_uri,
        Document.priority,
        Document.tenant,
        case((ReviewFlag.claimed_until > now, claimer.c.name), else_=None),
    ).outerjoin(claimer, claimer.c.id == ReviewFlag.claimed_by)
    if filters.reason:
        stmt = stmt.where(ReviewFlag.reason == filters.reason)
    stmt = stmt.order_by(PRIORITY_RANK, ReviewFlag.created_at, ReviewFlag.id).limit(limit)
    return [QueueRow(*row) for row in session.execute(stmt).all()]


def reason_counts(session: Session, account: Account, filters: Filters) -> dict[str, int]:
    """Open flags per reason under every filter but the reason itself."""
    stmt = _flag_rows(account, filters, ReviewFlag.reason, func.count(ReviewFlag.id))
    stmt = stmt.group_by(ReviewFlag.reason).order_by(ReviewFlag.reason)
    return dict(session.execute(stmt).all())


def _claim_free(account: Account, now: datetime) -> Any:
    return or_(
        ReviewFlag.claimed_by.is_(None),
        ReviewFlag.claimed_until <= now,
        ReviewFlag.claimed_by == account.id,
    )


def claim(session: Session, account: Account, region_id: int, seconds: int) -> bool:
    """Claim the region's open flags for `seconds`; False when someone else holds them."""
    now = utcnow()
    held = session.execute(
        update(ReviewFlag)
        .where(
            ReviewFlag.region_id == region_id,
            ReviewFlag.status == "open",
            _claim_free(account, now),
        )
        .values(claimed_by=account.id, claimed_until=now + timedelta(seconds=seconds))
    ).rowcount
    if held:
        return True
    return session.scalar(
        select(func.count(ReviewFlag.id)).where(
            ReviewFlag.region_id == region_id, ReviewFlag.status == "open"
        )
    ) == 0


def next_region(
    session: Session, account: Account, filters: Filters, seconds: int, *, tries: int = 5
) -> int | None:
    """Claim and return the first region in queue order that nobody else holds and this
    reviewer has not skipped; None when there is none."""
    now = utcnow()
    skipped = exists().where(
        Review.flag_id == ReviewFlag.id,
        Review.reviewer_id == account.id,
        Review.action == "skip",
    )
    stmt = _flag_rows(account, filters, ReviewFlag.region_id).where(
        _claim_free(account, now), ~skipped
    )
    if filters.reason:
        stmt = stmt.where(ReviewFlag.reason == filters.reason)
    stmt = stmt.order_by(PRIORITY_RANK, ReviewFlag.created_at, ReviewFlag.id).limit(tries)
    for region_id in session.scalars(stmt).all():
        if claim(session, account, region_id, seconds):
            return region_id
    return None


@dataclass(frozen=True)
class CandidateView:
    engine: str
    text: str
    confidence: float | None
    error: str | None
    scorer: str | None
    verdict: str | None
    score: float | None
    chosen: bool


@dataclass(frozen=True)
class FlagView:
    id: int
    reason: str
    detail: str | None
    status: str
    claimed_by: int | None
    claimed_until: datetime | None


@dataclass(frozen=True)
class ReviewView:
    id: int
    overrides_id: int | None
    action: str
    engine: str | None
    text: str | None
    reviewer: str
    at: datetime


@dataclass
class RegionDetail:
    id: int
    number: int
    category: str
    bbox: tuple[int, int, int, int]
    accepted: bool | None
    page_id: int
    page_number: int
    page_size: tuple[int, int]
    image_uri: str
    document_id: int
    source_uri: str
    document_status: str
    tenant: str  # "" for none
    candidates: list[CandidateView] = field(default_factory=list)
    flags: list[FlagView] = field(default_factory=list)
    reviews: list[ReviewView] = field(default_factory=list)

    @property
    def open_flags(self) -> list[FlagView]:
        return [f for f in self.flags if f.status == "open"]

    @property
    def version(self) -> int:
        """The id of the latest decision (0: none): what a decision is made against."""
        decided = [r.id for r in self.reviews if r.action != "skip"]
        return decided[-1] if decided else 0

    def held_by_other(self, account: Account, now: datetime) -> bool:
        """Whether another reviewer's claim on an open flag is live."""
        return any(
            f.claimed_by not in (None, account.id)
            and f.claimed_until is not None
            and aware(f.claimed_until) > now
            for f in self.open_flags
        )


def region_detail(session: Session, account: Account, region_id: int) -> RegionDetail | None:
    """Everything the region view shows, or None when it is not there for this account."""
    row = session.execute(
        scoped(
            select(
                Region.id,
                Region.number,
                Region.category,
                Region.x0,
                Region.y0,
                Region.x1,
                Region.y1,
                Region.accepted,
                Region.chosen_engine,
                Page.id,
                Page.number,
                Page.width,
                Page.height,
                Page.image_uri,
                Document.id,
                Document.source_uri,
                Document.status,
                Document.tenant,
            )
            .join(Page, Page.id == Region.page_id)
            .join(Document, Document.id == Page.document_id)
            .where(Region.id == region_id),
            account,
        )
    ).one_or_none()
    if row is None:
        return None
    (rid, number, category, x0, y0, x1, y1, accepted, chosen, page_id, page_number, width,
     height, image_uri, doc_id, source_uri, doc_status, tenant) = row  # fmt: skip
    detail = RegionDetail(
        id=rid,
        number=number,
        category=category,
        bbox=(x0, y0, x1, y1),
        accepted=accepted,
        page_id=page_id,
        page_number=page_number,
        page_size=(width, height),
        image_uri=image_uri,
        document_id=doc_id,
        source_uri=source_uri,
        document_status=doc_status,
        tenant=tenant,
    )
    for c in session.execute(
        select(
            Candidate.engine,
            Candidate.text,
            Candidate.confidence,
            Candidate.error,
            Score.scorer,
            Score.verdict,
            Score.score,
        )
        .outerjoin(Score, Score.candidate_id == Candidate.id)
        .where(Candidate.region_id == region_id)
        .order_by(Candidate.id, Score.id)
    ).all():
        detail.candidates.append(CandidateView(*c, chosen=c.engine == chosen))
    detail.flags = [
        FlagView(*f)
        for f in session.execute(
            select(
                ReviewFlag.id,
                ReviewFlag.reason,
                ReviewFlag.detail,
                ReviewFlag.status,
                ReviewFlag.claimed_by,
                ReviewFlag.claimed_until,
            )
            .where(ReviewFlag.region_id == region_id)
            .order_by(ReviewFlag.id)
        ).all()
    ]
    detail.reviews = [
        ReviewView(*r)
        for r in session.execute(
            select(
                Review.id,
                Review.overrides_id,
                Review.action,
                Review.engine,
                Review.final_text,
                User.name,
                Review.created_at,
            )
            .join(User, User.id == Review.reviewer_id)
            .where(Review.region_id == region_id)
            .order_by(Review.id)
        ).all()
    ]
    return detail


# Region states on the document view, and how each is drawn.
STATES = {
    "auto": "accepted automatically",
    "accept": "accepted by review",
    "correct": "corrected",
    "unreadable": "unreadable",
    "open": "open",
}


@dataclass(frozen=True)
class RegionState:
    region_id: int
    page_number: int
    number: int
    bbox: tuple[int, int, int, int]
    state: str


@dataclass(frozen=True)
class DocumentDetail:
    id: int
    source_uri: str
    status: str
    tenant: str  # "" for none
    pages: list[tuple[int, int]]  # (page id, number)
    regions: list[RegionState]


def document_detail(
    session: Session, account: Account, document_id: int
) -> DocumentDetail | None:
    doc = session.execute(
        scoped(
            select(Document.id, Document.source_uri, Document.status, Document.tenant).where(
                Document.id == document_id
            ),
            account,
        )
    ).one_or_none()
    if doc is None:
        return None
    pages = session.execute(
        select(Page.id, Page.number).where(Page.document_id == document_id).order_by(Page.number)
    ).all()
    latest = (
        select(Review.action)
        .where(Review.region_id == Region.id, Review.action != "skip")
        .order_by(Review.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    is_open = exists().where(
        and_(ReviewFlag.region_id == Region.id, ReviewFlag.status == "open")
    )
    rows = session.execute(
        select(
            Region.id, Page.number, Region.number, Region.x0, Region.y0, Region.x1, Region.y1,
            is_open, latest,
        )
        .join(Page, Page.id == Region.page_id)
        .where(Page.document_id == document_id)
        .order_by(Page.number, Region.number)
    ).all()  # fmt: skip
    regions = [
        RegionState(
            region_id=rid,
            page_number=page,
            number=number,
            bbox=(x0, y0, x1, y1),
            state="open" if flagged else (action or "auto"),
        )
        for rid, page, number, x0, y0, x1, y1, flagged, action in rows
    ]
    return DocumentDetail(
        id=doc[0], source_uri=doc[1], status=doc[2], tenant=doc[3], pages=list(pages),
        regions=regions,
    )  # fmt: skip
