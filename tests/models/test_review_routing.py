"""A page through scoring, review and the database with the tiny Jev checkpoint: regions the
scorer could not judge end in review with their verdict as the reason and no score stored,
never as a low score."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image, ImageDraw
from sqlalchemy import select

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.persist import save_page_result
from ocrfleet.db.session import session_scope
from ocrfleet.pipeline.review import decide, score_units

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.models


def page_with_regions() -> tuple[Image.Image, list[ir.Region], list[ir.Candidate]]:
    """A page with four regions: a plain line, a formula whose LaTeX cannot be parsed, a
    1000x4 sliver the image processor refuses (forward fails), and a blank area."""
    page = Image.new("RGB", (1200, 400), (246, 244, 240))
    draw = ImageDraw.Draw(page)
    draw.text((20, 20), "Invoice 2041", fill=(20, 20, 20))
    draw.text((20, 120), "x^2 + y^2", fill=(20, 20, 20))
    draw.line((100, 301, 1090, 301), fill=(20, 20, 20), width=2)
    boxes = [
        (ir.Category.text, ir.BBox(x0=10, y0=10, x1=170, y1=50)),
        (ir.Category.formula, ir.BBox(x0=10, y0=110, x1=170, y1=150)),
        (ir.Category.text, ir.BBox(x0=95, y0=299, x1=1095, y1=303)),
        (ir.Category.text, ir.BBox(x0=600, y0=20, x1=760, y1=60)),
    ]
    regions = [
        ir.Region(number=n, category=category, bbox=bbox)
        for n, (category, bbox) in enumerate(boxes, start=1)
    ]
    texts = ["Invoice 2041", r"\frac{x^2 + {y^2", "a rule", "ghost text"]
    candidates = [
        ir.Candidate(region_number=n, engine="rapidocr", text=t, confidence=0.9)
        for n, t in enumerate(texts, start=1)
    ]
    return page, regions, candidates


@pytest.fixture(scope="module")
def jev_settings(tiny_jev_path: Path) -> Settings:
    return Settings(
        scorer="jev",
        jev_model_path=tiny_jev_path,
        jev_dtype="float32",
        jev_device="cpu",
        jev_batch_size=4,
        threshold_text=0.0,  # the random model's scores must not decide the first region
    )


def test_unscorable_regions_go_to_review_with_their_verdict(
    jev_settings: Settings, db_url: str
) -> None:
    from ocrfleet.scorers import load_scorer

    page, regions, candidates = page_with_regions()
    scores = score_units(page, regions, candidates, load_scorer(jev_settings))
    decisions = decide(regions, candidates, scores, jev_settings)
    assert [s.verdict for s in scores] == [
        ir.Verdict.scored,
        ir.Verdict.render_failed,
        ir.Verdict.forward_failed,
        ir.Verdict.precheck_failed,
    ]
    result = ir.PageResult(
        page_number=1, regions=regions, candidates=candidates, scores=scores, decisions=decisions
    )

    upgrade(db_url)
    with session_scope(db_url) as session:
        session.add(models.Run(id="r" * 64, config={}))
        session.flush()
        doc = models.Document(run_id="r" * 64, sha256="0" * 64, source_uri="mem://page")
        session.add(doc)
        session.flush()
        page_row = models.Page(document_id=doc.id, number=1, width=1200, height=400, image_uri="")
        session.add(page_row)
        session.flush()
        save_page_result(session, page_row.id, result)

    with session_scope(db_url) as session:
        rows = session.execute(
            select(models.Region.number, models.Region.accepted, models.ReviewFlag.reason)
            .outerjoin(models.ReviewFlag, models.ReviewFlag.region_id == models.Region.id)
            .order_by(models.Region.number)
        ).all()
        stored = session.execute(
            select(models.Region.number, models.Score.verdict, models.Score.score)
            .join(models.Candidate, models.Candidate.region_id == models.Region.id)
            .join(models.Score, models.Score.candidate_id == models.Candidate.id)
            .order_by(models.Region.number)
        ).all()
    assert [tuple(r) for r in rows] == [
        (1, True, None),
        (2, False, "not_scored:render_failed"),
        (3, False, "not_scored:forward_failed"),
        (4, False, "not_scored:precheck_failed"),
    ]
    assert stored[0].verdict == "scored" and 0.0 <= stored[0].score <= 1.0
    assert [(s.verdict, s.score) for s in stored[1:]] == [
        ("render_failed", None),
        ("forward_failed", None),
        ("precheck_failed", None),
    ]
