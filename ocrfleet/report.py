"""Read-side queries: the summaries `ocrfleet run` prints, and which document a reference
names (results themselves are rendered by `ocrfleet.formats`)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ocrfleet.db import models


@dataclass(frozen=True)
class DocumentSummary:
    document_id: int
    sha256: str
    status: str
    reason: str | None
    pages: int
    pages_done: int
    regions: int
    flagged: int
    mean_confidence: float | None
    reasons: tuple[str, ...] = ()  # the document's reason, then each failed page's
    awaiting_review: int = 0  # regions with an open flag: what a person still has to look at

    @property
    def review_path(self) -> str | None:
        """Where the review app (`ocrfleet review`) shows this document, if it has work."""
        return f"/documents/{self.document_id}" if self.awaiting_review else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "review_path": self.review_path}


def document_summaries(session: Session, document_ids: list[int]) -> list[DocumentSummary]:
    """One summary per id, in the order given (an id may repeat)."""
    docs = {
        d.id: d
        for d in session.scalars(
            select(models.Document).where(models.Document.id.in_(set(document_ids)))
        )
    }
    region_counts = dict(
        session.execute(
            select(models.Page.document_id, func.count(models.Region.id))
            .join(models.Region, models.Region.page_id == models.Page.id)
            .where(models.Page.document_id.in_(docs))
            .group_by(models.Page.document_id)
        ).all()
    )
    flag_counts = dict(
        session.execute(
            select(models.Page.document_id, func.count(models.ReviewFlag.id))
            .join(models.Region, models.Region.page_id == models.Page.id)
            .join(models.ReviewFlag, models.ReviewFlag.region_id == models.Region.id)
            .where(models.Page.document_id.in_(docs))
            .group_by(models.Page.document_id)
        ).all()
    )
    awaiting = dict(
        session.execute(
            select(models.Page.document_id, func.count(func.distinct(models.Region.id)))
            .join(models.Region, models.Region.page_id == models.Page.id)
            .join(models.ReviewFlag, models.ReviewFlag.region_id == models.Region.id)
            .where(models.Page.document_id.in_(docs), models.ReviewFlag.status == "open")
            .group_by(models.Page.document_id)
        ).all()
    )
    chosen = (models.Candidate.region_id == models.Region.id) & (
        models.Candidate.engine == models.Region.chosen_engine
    )
    confidences = dict(
        session.execute(
            select(models.Page.document_id, func.avg(models.Candidate.confidence))
            .join(models.Region, models.Region.page_id == models.Page.id)
            .join(models.Candidate, chosen)
            .where(models.Page.document_id.in_(docs))
            .group_by(models.Page.document_id)
        ).all()
    )
    page_reasons: dict[int, list[str]] = {}
    for doc_id, number, reason in session.execute(
        select(models.Page.document_id, models.Page.number, models.Page.reason)
        .where(models.Page.document_id.in_(docs), models.Page.status == "failed")
        .order_by(models.Page.document_id, models.Page.number)
    ):
        page_reasons.setdefault(doc_id, []).append(f"page {number}: {reason}")
    return [
        DocumentSummary(
            document_id=doc.id,
            sha256=doc.sha256,
            status=doc.status,
            reason=doc.reason,
            pages=doc.page_count or 0,
            pages_done=doc.pages_done,
            regions=region_counts.get(doc.id, 0),
            flagged=flag_counts.get(doc.id, 0),
            mean_confidence=(
                None if confidences.get(doc.id) is None else float(confidences[doc.id])
            ),
            reasons=tuple(([doc.reason] if doc.reason else []) + page_reasons.get(doc.id, [])),
            awaiting_review=awaiting.get(doc.id, 0),
        )
        for doc in (docs[i] for i in document_ids)
    ]


def resolve_document(session: Session, ref: str) -> int | None:
    """A document id, an input's sha256, or an input's path (hashed); newest match wins."""
    if ref.isdigit() and session.get(models.Document, int(ref)) is not None:
        return int(ref)
    sha256 = ref.lower()
    path = Path(ref)
    if path.is_file():
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    return session.scalar(
        select(models.Document.id)
        .where(models.Document.sha256 == sha256)
        .order_by(models.Document.created_at.desc(), models.Document.id.desc())
        .limit(1)
    )
