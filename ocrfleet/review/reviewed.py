"""Reviewed regions as evidence: each region's latest decision beside what the engines
read and how the scorer scored it. Training exports and thresholds both start here."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from ocrfleet.db.models import Candidate, Document, Page, Region, Review, Score
from ocrfleet.labels import same_text


@dataclass(frozen=True)
class Reading:
    engine: str
    text: str
    error: str | None
    verdict: str | None
    score: float | None


@dataclass
class ReviewedRegion:
    region_id: int
    sha256: str
    page_number: int
    image_uri: str
    number: int
    category: str
    bbox: tuple[int, int, int, int]
    chosen_engine: str | None
    action: str  # accept | correct | unreadable
    final_text: str
    readings: list[Reading] = field(default_factory=list)

    @property
    def page_key(self) -> str:
        """The page across runs: the same input page is one page whatever the run."""
        return f"{self.sha256}:{self.page_number}"

    def usable(self, reading: Reading) -> bool:
        """Whether a reading is what the reviewer settled on (never for unreadable), by the
        one label rule (`ocrfleet.labels`), so exports and threshold proposals from reviews
        label as every fit and bench does. Case counts: a reviewer's text is not upper-cased
        the way some transcripts are."""
        return self.action != "unreadable" and same_text(reading.text, self.final_text)

    @property
    def chosen(self) -> Reading | None:
        return next((r for r in self.readings if r.engine == self.chosen_engine), None)


def reviewed_regions(
    session: Session, category: str | None = None, tenant: str | None = None
) -> list[ReviewedRegion]:
    """Every region whose latest non-skip review decided it, in document/page/region order."""
    latest = (
        select(Review.region_id, Review.action, Review.final_text, Review.id)
        .where(Review.action != "skip")
        .order_by(Review.region_id, Review.id)
    )
    decided = {row.region_id: row for row in session.execute(latest).all()}  # last wins
    if not decided:
        return []
    stmt = (
        select(
            Region.id, Document.sha256, Page.number, Page.image_uri, Region.number,
            Region.category, Region.x0, Region.y0, Region.x1, Region.y1, Region.chosen_engine,
        )
        .join(Page, Page.id == Region.page_id)
        .join(Document, Document.id == Page.document_id)
        .where(Region.id.in_(decided))
        .order_by(Document.id, Page.number, Region.number)
    )  # fmt: skip
    if category is not None:
        stmt = stmt.where(Region.category == category)
    if tenant is not None:
        stmt = stmt.where(Document.tenant == tenant)
    regions: dict[int, ReviewedRegion] = {}
    for rid, sha, page, uri, number, cat, x0, y0, x1, y1, chosen in session.execute(stmt).all():
        review = decided[rid]
        regions[rid] = ReviewedRegion(
            region_id=rid, sha256=sha, page_number=page, image_uri=uri, number=number,
            category=cat, bbox=(x0, y0, x1, y1), chosen_engine=chosen, action=review.action,
            final_text=review.final_text or "",
        )  # fmt: skip
    for region_id, engine, text, error, verdict, score in session.execute(
        select(
            Candidate.region_id, Candidate.engine, Candidate.text, Candidate.error,
            Score.verdict, Score.score,
        )
        .outerjoin(Score, Score.candidate_id == Candidate.id)
        .where(Candidate.region_id.in_(regions))
        .order_by(Candidate.id, Score.id)
    ).all():  # fmt: skip
        readings = regions[region_id].readings
        if readings and readings[-1].engine == engine:
            readings.pop()  # one reading per engine: its latest score
        readings.append(Reading(engine, text, error, verdict, score))
    return list(regions.values())
