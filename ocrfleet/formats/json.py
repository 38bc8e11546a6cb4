"""JSON: the document, its pages, each page's regions in reading order with final text,
the decision (accepted, flag reason, the chosen candidate's score and the threshold it was
held to, whether it awaits review), every candidate with its scores, and the words of the
final text.
The source is named by `meta.filename` where one was given, never by its store URI."""

from __future__ import annotations

import json
from typing import Any

from ocrfleet import ir
from ocrfleet.formats import text
from ocrfleet.formats.document import DocumentView, RegionView

MEDIA_TYPE = "application/json"


def _word(word: ir.Word) -> dict[str, Any]:
    return {
        "text": word.text,
        "bbox": list(word.bbox.as_tuple()),
        "confidence": word.confidence,
        "line": word.line,
        "approximate": word.approximate,
    }


def _review(review: ir.Review | None) -> dict[str, Any] | None:
    if review is None:
        return None
    return {
        "action": review.action.value,
        "engine": review.engine,
        "text": review.text,
        "reviewer": review.reviewer,
        "reviewed_at": review.reviewed_at.isoformat(),
    }


def _region(view: RegionView) -> dict[str, Any]:
    decision = view.decision
    return {
        "number": view.region.number,
        "category": view.category,
        "bbox": list(view.region.bbox.as_tuple()),
        "det_score": view.region.det_score,
        "text": view.text,
        "engine": view.engine,
        "confidence": view.confidence,
        "accepted": decision.accepted if decision else None,
        "chosen_engine": decision.chosen_engine if decision else None,
        "flag": decision.flag_reason if decision else None,
        "score": view.score,
        "threshold": decision.threshold if decision else None,
        "awaiting_review": view.awaiting_review is not None,
        "review": _review(view.review),
        "words": [_word(w) for w in view.words],
        "candidates": [
            {
                "engine": c.engine,
                "text": c.text,
                "confidence": c.confidence,
                "error": c.error,
                "truncated": c.truncated,
                "read_as": c.read_as,
                "skipped": c.skipped,
                "scores": [
                    {
                        "scorer": s.scorer,
                        "scorer_version": s.scorer_version,
                        "verdict": s.verdict.value,
                        "score": s.score,
                        "error": s.error,
                    }
                    for s in view.scores
                    if s.engine == c.engine
                ],
            }
            for c in view.candidates
        ],
    }


def as_dict(doc: DocumentView) -> dict[str, Any]:
    return {
        "id": doc.id,
        "run_id": doc.run_id,
        "sha256": doc.sha256,
        "media_type": doc.media_type,
        "status": doc.status,
        "reason": doc.reason,
        "page_count": doc.page_count,
        "pages_done": doc.pages_done,
        "pages_failed": doc.pages_failed,
        "meta": doc.meta,
        "text": text.render(doc),
        "pages": [
            {
                "number": page.number,
                "width": page.width,
                "height": page.height,
                "status": page.status,
                "reason": page.reason,
                "text": page.text,
                "regions": [_region(r) for r in page.regions],
            }
            for page in doc.pages
        ],
    }


def render(doc: DocumentView) -> str:
    return json.dumps(as_dict(doc), indent=2, ensure_ascii=False)
