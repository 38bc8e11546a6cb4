"""The engine fallback chain with real engines: RapidOCR first, tesseract second."""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines import load_recognisers
from ocrfleet.pipeline.recognise import recognise
from ocrfleet.pipeline.review import ENGINE_FAILED, decide

FONT = "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"


@pytest.fixture(scope="module")
def page_and_regions() -> tuple[Image.Image, list[ir.Region]]:
    """Two text lines, a black rule (ink RapidOCR reads as nothing) and a zero-width region
    (which every engine refuses)."""
    font = ImageFont.truetype(FONT, 28)
    page = Image.new("RGB", (600, 200), "white")
    draw = ImageDraw.Draw(page)
    draw.text((10, 10), "Invoice number 4711", font=font, fill="black")
    draw.rectangle((10, 74, 400, 102), fill="black")
    draw.text((10, 120), "Total due 12.50", font=font, fill="black")
    boxes = [(0, 0, 400, 60), (0, 70, 420, 106), (0, 110, 400, 170), (5, 5, 5, 40)]
    regions = [
        ir.Region(number=n, bbox=ir.BBox(x0=a, y0=b, x1=c, y1=d))
        for n, (a, b, c, d) in enumerate(boxes, start=1)
    ]
    return page, regions


@pytest.fixture(scope="module")
def engines():
    return load_recognisers(Settings(engines=["rapidocr", "tesseract"]))


def test_chain_hands_failed_regions_on_and_records_why(page_and_regions, engines):
    page, regions = page_and_regions
    candidates = recognise(page, regions, engines, mode="chain")
    by_region = {c.region_number: c for c in candidates}
    assert len(candidates) == len(regions) == len(by_region)  # one candidate per region

    assert by_region[1].engine == by_region[3].engine == "rapidocr"
    assert by_region[1].skipped == by_region[3].skipped == []
    assert "4711" in by_region[1].text and "12.50" in by_region[3].text

    rule = by_region[2]  # RapidOCR read nothing from ink: tesseract got it
    assert rule.engine == "tesseract"
    assert rule.skipped == ["rapidocr: empty text for a crop with ink"]

    empty = by_region[4]  # both engines raised: the last one's error, the chain recorded
    assert empty.engine == "tesseract" and empty.error is not None
    assert len(empty.skipped) == 1 and empty.skipped[0].startswith("rapidocr: ValueError")

    decisions = decide(regions, candidates, [], Settings())
    assert decisions[3].flag_reason == ENGINE_FAILED


def test_best_of_n_asks_every_engine(page_and_regions, engines):
    page, regions = page_and_regions
    candidates = recognise(page, regions, engines, mode="best_of_n")
    assert [(c.region_number, c.engine) for c in candidates] == [
        (n, e) for n in (1, 2, 3, 4) for e in ("rapidocr", "tesseract")
    ]
    assert all(c.skipped == [] for c in candidates)
