"""Business rules on real receipts (SROIE scans beside the checkout), through the real
pipeline: a date rule and a total-amount rule on the document's text (one receipt passes
both, the other breaks the date rule and is flagged `rule:date` with the offending text),
and a region rule that catches an OCR artefact in one region."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.models import Candidate, Document, Page, Region, ReviewFlag
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.service import Context, ingest, process_page
from tests.conftest import REALDOCS

pytestmark = pytest.mark.integration

SROIE = REALDOCS.parent / "train" / "sroie"
RULES = """
# Dates as the business writes them, and a total followed by an amount.
[rules.date]
on = "document"
check = "date"
find = '\\b(\\d{1,2}[/-]\\d{1,2}[/-]\\d{2,4})\\b'
formats = ["%d/%m/%Y", "%d-%m-%Y"]
required = true

[rules.total]
on = "document"
check = "field"
label = '(?i)\\btotal\\b'
within = 120

# Receipt printers print dots, not the ellipsis character: where it appears, OCR made it.
[rules.ellipsis]
on = "region"
check = "regex"
pattern = '\u2026'
must_match = false
"""


def rule_flags(url: str, document_id: int) -> dict[str, str]:
    """reason -> detail of the document's rule flags; each flag sits on the region whose
    text holds the offending value."""
    with session_scope(url) as session:
        rows = session.execute(
            select(ReviewFlag.reason, ReviewFlag.detail, Candidate.text)
            .join(Region, Region.id == ReviewFlag.region_id)
            .join(Page, Page.id == Region.page_id)
            .join(Candidate, Candidate.region_id == Region.id)
            .where(Page.document_id == document_id, ReviewFlag.reason.like("rule:%"))
        ).all()
    for _, detail, region_text in rows:
        assert detail in region_text
    return {reason: detail for reason, detail, _ in rows}


def test_date_and_total_rules_on_real_receipts(tmp_path: Path, sqlite_url: str) -> None:
    receipts = [SROIE / "images" / "001.jpg", SROIE / "images" / "004.jpg"]
    if not all(path.is_file() for path in receipts):
        pytest.skip(f"the SROIE receipts are not at {SROIE} (set OCRFLEET_REALDOCS)")
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    upgrade(sqlite_url)
    ctx = Context(
        Settings(database_url=sqlite_url, store_url=f"file://{tmp_path / 'store'}",
                 rules=rules)
    )  # fmt: skip
    assert ctx.run_config["rules"] == ctx.rules.sha256
    ids = []
    for path in receipts:
        outcome = ingest(ctx, str(path))
        for page_id in outcome.page_ids:
            process_page(ctx, page_id)
        ids.append(outcome.document_id)
    passing, failing = ids

    # 001.jpg: "19/10/2018" parses and "TOTAL AMT" is followed by amounts. Whether an
    # ellipsis shows up depends on the recogniser's reading of the dotted leaders; where it
    # does, rule_flags has checked that it sits on the region holding it.
    assert set(rule_flags(sqlite_url, passing)) <= {"rule:ellipsis"}
    # 004.jpg prints "18-11-18": two-digit years are not a format the business accepts.
    assert rule_flags(sqlite_url, failing) == {"rule:date": "18-11-18"}
    with session_scope(sqlite_url) as session:
        assert session.get(Document, failing).status == "done"
    dispose_engines()
