"""Business rules against stored text: a failed rule becomes an open review flag
`rule:<name>` on the region holding the offending text, in the transaction that wrote it.

Region rules run on each region as its page is saved; document rules run once, when the
last page of the document finishes, on the text the `document_text_lines` view gives. A
document rule whose value is missing altogether (nothing to point at) flags the document's
last region, where receipts and invoices keep their totals."""

from __future__ import annotations

import bisect
from collections import defaultdict

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ocrfleet import ir
from ocrfleet.db.models import Region, ReviewFlag
from ocrfleet.db.upsert import upsert_many
from ocrfleet.pipeline.rules import NOT_FOUND, Failure, RuleSet, check, detail


def _write(session: Session, failures: dict[tuple[int, str], list[Failure]]) -> None:
    upsert_many(
        session,
        ReviewFlag,
        [
            {"region_id": region_id, "reason": reason, "detail": detail(found)}
            for (region_id, reason), found in sorted(failures.items())
        ],
        key=["region_id", "reason"],
        update=["detail"],
    )


def flag_page(session: Session, page_id: int, result: ir.PageResult, rules: RuleSet) -> None:
    """Region rules on each region of a saved page."""
    region_rules = rules.on("region")
    if not region_rules:
        return
    region_ids = dict(
        session.execute(select(Region.number, Region.id).where(Region.page_id == page_id)).all()
    )
    failures: dict[tuple[int, str], list[Failure]] = defaultdict(list)
    for region in result.regions:
        content = result.region_text(region.number)
        for rule in region_rules:
            if rule.category is not None and rule.category != region.category.value:
                continue
            for failure in check(rule, content):
                failures[(region_ids[region.number], rule.reason)].append(failure)
    _write(session, failures)


def flag_document(session: Session, document_id: int, rules: RuleSet) -> None:
    """Document rules on the document's whole text, read through the text view."""
    document_rules = rules.on("document")
    if not document_rules:
        return
    lines = session.execute(
        text(
            "SELECT l.text, r.id FROM document_text_lines l "
            "JOIN pages p ON p.document_id = l.document_id AND p.number = l.page_number "
            "JOIN regions r ON r.page_id = p.id AND r.number = l.region_number "
            "WHERE l.document_id = :id ORDER BY l.page_number, l.region_number"
        ),
        {"id": document_id},
    ).all()
    if not lines:
        return
    starts: list[int] = []
    offset = 0
    for line, _ in lines:
        starts.append(offset)
        offset += len(line or "") + 1  # the newline that joins regions
    whole = "\n".join(line or "" for line, _ in lines)
    failures: dict[tuple[int, str], list[Failure]] = defaultdict(list)
    for rule in document_rules:
        for failure in check(rule, whole):
            index = len(lines) - 1 if failure.offset == NOT_FOUND else (
                bisect.bisect_right(starts, failure.offset) - 1
            )  # fmt: skip
            failures[(lines[index][1], rule.reason)].append(failure)
    _write(session, failures)
