"""Flagged text is marked wherever it leaves ocrfleet: hOCR `x_wconf` and ALTO `WC` are the
region's verified score, a region awaiting review carries its flag (hOCR `data-flag`, an ALTO
`OtherTag`), and JSON carries each region's decision with its score and threshold. Stored
rows on SQLite, read back through the one loader, ALTO validated against the 4.4 XSD."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from lxml import etree

from ocrfleet import ir
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.models import Document, Page, Run
from ocrfleet.db.persist import save_page_result
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.formats import load_document, render
from ocrfleet.formats.document import DocumentView
from tests.unit.test_formats import alto_schema

HTML = {"h": "http://www.w3.org/1999/xhtml"}


def box(y: int) -> ir.BBox:
    return ir.BBox(x0=10, y0=y, x1=300, y1=y + 30)


def score(number: int, value: float | None, verdict: ir.Verdict) -> ir.Score:
    return ir.Score(
        region_number=number,
        engine="rapidocr",
        scorer="consensus",
        scorer_version="v",
        verdict=verdict,
        score=value,
        error=None if value is not None else "why",
    )


RESULT = ir.PageResult(
    page_number=1,
    regions=[
        ir.Region(number=1, bbox=box(10)),
        ir.Region(number=2, bbox=box(50)),
        ir.Region(number=3, bbox=box(90)),
        ir.Region(number=4, category=ir.Category.figure, bbox=box(130)),
    ],
    candidates=[
        ir.Candidate(region_number=1, engine="rapidocr", text="Invoice 4711", confidence=0.6),
        ir.Candidate(region_number=2, engine="rapidocr", text="Involce 47l1", confidence=0.99),
        ir.Candidate(region_number=3, engine="rapidocr", text="Total 12.00", confidence=0.98),
    ],
    scores=[
        score(1, 0.973, ir.Verdict.scored),
        score(2, 0.41, ir.Verdict.scored),
        score(3, 0.995, ir.Verdict.bounded),  # a bound, not a verification
    ],
    decisions=[
        ir.Decision(region_number=1, chosen_engine="rapidocr", accepted=True, threshold=0.95),
        ir.Decision(
            region_number=2,
            chosen_engine="rapidocr",
            accepted=False,
            flag_reason="low_score",
            threshold=0.95,
        ),
        ir.Decision(
            region_number=3,
            chosen_engine="rapidocr",
            accepted=False,
            flag_reason="screened",
            threshold=0.95,
        ),
        ir.Decision(region_number=4, chosen_engine=None, accepted=True),
    ],
)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """The page saved once: (database URL, document id)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('flagged') / 'f.db'}"
    upgrade(url)
    try:
        with session_scope(url) as session:
            session.add(Run(id="r" * 64, config={"dpi": 100}))
            session.flush()
            document = Document(run_id="r" * 64, sha256="b" * 64, source_uri="x", status="done")
            session.add(document)
            session.flush()
            page = Page(
                document_id=document.id,
                number=1,
                width=400,
                height=200,
                image_uri="x",
                status="done",
            )
            session.add(page)
            session.flush()
            save_page_result(session, page.id, RESULT)
            document_id = document.id
        yield url, document_id
    finally:
        dispose_engines()


@pytest.fixture(scope="module")
def doc(stored: tuple[str, int]) -> DocumentView:
    url, document_id = stored
    with session_scope(url) as session:
        return load_document(session, document_id)


def test_hocr_word_confidence_is_the_verified_score_and_flags_are_marked(doc) -> None:
    root = etree.fromstring(render(doc, "hocr"))
    areas = root.findall(".//h:div[@class='ocr_carea']", HTML)
    confs = {}
    for area in areas:
        words = area.findall(".//h:span[@class='ocrx_word']", HTML)
        found = {re.search(r"x_wconf (\d+)", w.get("title")).group(1) for w in words}
        confs[area.get("id")] = (sorted(found), area.get("data-flag"))
    assert confs == {
        "block_1_1": (["97"], None),  # not the engine's 60
        "block_1_2": (["41"], "low_score"),  # not the engine's 99
        "block_1_3": (["0"], "screened"),  # a bound is not a verified score
        "block_1_4": ([], None),
    }


def test_alto_word_confidence_is_the_verified_score_and_flags_are_tagged(doc) -> None:
    alto = etree.fromstring(render(doc, "alto"))
    alto_schema().assertValid(alto)
    tags = {t.get("ID"): t.get("LABEL") for t in alto.iter("{*}OtherTag")}
    assert sorted(tags.values()) == ["low_score", "screened"]
    blocks = {
        b.get("ID"): (tags.get(b.get("TAGREFS")), {s.get("WC") for s in b.iter("{*}String")})
        for b in alto.iter("{*}TextBlock")
    }
    assert blocks == {
        "block_1_1": (None, {"0.9730"}),
        "block_1_2": ("low_score", {"0.4100"}),
        "block_1_3": ("screened", {"0.0000"}),
        "block_1_4": (None, set()),
    }


def test_json_carries_each_regions_decision_score_and_threshold(doc) -> None:
    regions = json.loads(render(doc, "json"))["pages"][0]["regions"]
    decided = [
        (r["accepted"], r["flag"], r["score"], r["threshold"], r["awaiting_review"])
        for r in regions
    ]
    assert decided == [
        (True, None, 0.973, 0.95, False),
        (False, "low_score", 0.41, 0.95, True),
        (False, "screened", 0.995, 0.95, True),
        (True, None, None, None, False),
    ]


def test_a_reviewed_region_is_verified_by_a_person(doc) -> None:
    from dataclasses import replace

    flagged = doc.pages[0].regions[1]
    review = ir.Review(
        region_number=2,
        action=ir.ReviewAction.correct,
        text="Invoice 4711",
        reviewer="ann",
        reviewed_at=datetime(2026, 12, 2, tzinfo=UTC),
    )
    reviewed = replace(flagged, review=review)
    assert (flagged.verified, flagged.awaiting_review) == (0.41, "low_score")
    assert (reviewed.verified, reviewed.awaiting_review) == (1.0, None)


def test_the_decision_threshold_survives_the_store(doc) -> None:
    assert [r.decision.threshold for r in doc.pages[0].regions] == [0.95, 0.95, 0.95, None]


def test_the_run_summary_counts_regions_awaiting_review_and_says_how_to_open_them(
    stored, doc
) -> None:
    from rich.console import Console

    from ocrfleet.cli import _print_review_hint
    from ocrfleet.db.models import Region, ReviewFlag
    from ocrfleet.report import document_summaries

    url, document_id = stored
    with session_scope(url) as session:
        (summary,) = document_summaries(session, [document_id])
    assert (summary.flagged, summary.awaiting_review) == (2, 2)
    assert summary.as_dict()["review_path"] == f"/documents/{document_id}"
    out = Console(record=True, width=200)
    _print_review_hint([summary], out)
    hint = out.export_text()
    assert "2 region(s) in 1 document(s) await review" in hint
    assert "`ocrfleet review`" in hint and f"/documents/{document_id}" in hint

    with session_scope(url) as session:  # a person closes both flags: nothing awaits
        session.query(ReviewFlag).filter(
            ReviewFlag.region_id.in_(session.query(Region.id))
        ).update({"status": "resolved"}, synchronize_session=False)
    with session_scope(url) as session:
        (summary,) = document_summaries(session, [document_id])
    assert (summary.flagged, summary.awaiting_review, summary.review_path) == (2, 0, None)
    quiet = Console(record=True, width=200)
    _print_review_hint([summary], quiet)
    assert quiet.export_text() == ""
