"""A document as every output format sees it: pages, regions in reading order, each with
its final text and words, read through the one loader (`persist.load_page_result`).

The final text is `PageResult.region_text` (a reviewer's text where review exists); its
words are the engine's boxes when an engine read exactly that text, else proportional
boxes in the region (`pipeline.words`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ocrfleet import ir
from ocrfleet.db import models
from ocrfleet.db.persist import load_page_result
from ocrfleet.errors import public_reason
from ocrfleet.pipeline.words import approximate, words_of


@dataclass(frozen=True)
class Line:
    """Words sharing a line number within a region; its box is theirs, united."""

    bbox: ir.BBox
    words: list[ir.Word]


@dataclass(frozen=True)
class RegionView:
    region: ir.Region
    text: str
    words: list[ir.Word]
    engine: str | None  # whose words these are; None when no engine read the final text
    confidence: float | None
    decision: ir.Decision | None
    review: ir.Review | None  # a person's last word on the region, whose text `text` is
    candidates: list[ir.Candidate]
    scores: list[ir.Score]

    @property
    def category(self) -> str:
        return self.region.category.value

    @property
    def awaiting_review(self) -> str | None:
        """The flag reason while the region waits for a person; None once accepted or
        reviewed."""
        if self.decision is None or self.decision.accepted or self.review is not None:
            return None
        return self.decision.flag_reason

    @property
    def score(self) -> float | None:
        """The scorer's score of the chosen candidate (an upper bound where its verdict is
        `bounded`); None when it has none."""
        chosen = self.decision.chosen_engine if self.decision else None
        return next(
            (s.score for s in self.scores if s.engine == chosen and s.score is not None), None
        )

    @property
    def verified(self) -> float | None:
        """How far the text is verified, 0-1, for word confidences in hOCR and ALTO: 1 where
        a person decided it; otherwise the chosen candidate's score where it was verified
        (`scored`) and 0 where it was not. None for a region with no text to verify (a
        figure, or one no decision covers)."""
        if self.review is not None:
            return 1.0
        if self.decision is None or self.decision.chosen_engine is None:
            return None
        chosen = self.decision.chosen_engine
        verified = [
            s.score
            for s in self.scores
            if s.engine == chosen and s.verdict == ir.Verdict.scored and s.score is not None
        ]
        return min(max(verified[0], 0.0), 1.0) if verified else 0.0

    @property
    def lines(self) -> list[Line]:
        by_line: dict[int, list[ir.Word]] = {}
        for word in self.words:
            by_line.setdefault(word.line, []).append(word)
        return [Line(union(w.bbox for w in words), words) for _, words in sorted(by_line.items())]


@dataclass(frozen=True)
class PageView:
    number: int
    width: int
    height: int
    status: str
    reason: str | None
    image_uri: str
    regions: list[RegionView]

    @property
    def text(self) -> str:
        return "\n".join(region.text for region in self.regions)


@dataclass(frozen=True)
class DocumentView:
    id: int
    run_id: str
    sha256: str
    source_uri: str
    media_type: str | None
    status: str
    reason: str | None
    page_count: int | None
    pages_done: int
    pages_failed: int
    meta: dict[str, Any] | None
    dpi: int
    pages: list[PageView]

    @property
    def filename(self) -> str | None:
        """The name the input was submitted under, if any: outputs name their source by it,
        never by `source_uri`, the fleet's own store URI."""
        name = (self.meta or {}).get("filename")
        return str(name) if name else None


def union(boxes: Any) -> ir.BBox:
    boxes = list(boxes)
    return ir.BBox(
        x0=min(b.x0 for b in boxes),
        y0=min(b.y0 for b in boxes),
        x1=max(b.x1 for b in boxes),
        y1=max(b.y1 for b in boxes),
    )


def region_views(result: ir.PageResult) -> list[RegionView]:
    decisions = {d.region_number: d for d in result.decisions}
    reviews = {r.region_number: r for r in result.reviews}
    views = []
    for region in result.regions:
        own = [c for c in result.candidates if c.region_number == region.number]
        text = result.region_text(region.number)
        decision = decisions.get(region.number)
        chosen = decision.chosen_engine if decision else None
        # Prefer the chosen engine's boxes, then any engine that read exactly this text.
        ranked = sorted(own, key=lambda c: (c.engine != chosen, c.error is not None, c.engine))
        source = next((c for c in ranked if c.error is None and c.text == text), None)
        if source is not None:
            words = words_of(source, region.bbox)
            engine, confidence = source.engine, source.confidence
        else:
            words, engine, confidence = approximate(text, region.bbox), None, None
        views.append(
            RegionView(
                region=region,
                text=text,
                words=words,
                engine=engine,
                confidence=confidence,
                decision=decision,
                review=reviews.get(region.number),
                candidates=own,
                scores=[s for s in result.scores if s.region_number == region.number],
            )
        )
    return views


def load_document(session: Session, document_id: int) -> DocumentView:
    """Everything the formats need, from the stored rows; LookupError if there is none."""
    doc = session.get(models.Document, document_id)
    if doc is None:
        raise LookupError(f"no document {document_id}")
    run = session.get(models.Run, doc.run_id)
    pages = session.scalars(
        select(models.Page)
        .where(models.Page.document_id == document_id)
        .order_by(models.Page.number)
    ).all()
    return DocumentView(
        id=doc.id,
        run_id=doc.run_id,
        sha256=doc.sha256,
        source_uri=doc.source_uri,
        media_type=doc.media_type,
        status=doc.status,
        reason=public_reason(doc.reason),
        page_count=doc.page_count,
        pages_done=doc.pages_done,
        pages_failed=doc.pages_failed,
        meta=doc.meta,
        dpi=int((run.config if run else {}).get("dpi") or 200),
        pages=[
            PageView(
                number=page.number,
                width=page.width,
                height=page.height,
                status=page.status,
                reason=public_reason(page.reason),
                image_uri=page.image_uri,
                regions=region_views(load_page_result(session, page.id))
                if page.status == ir.PageStatus.done
                else [],
            )
            for page in pages
        ],
    )
