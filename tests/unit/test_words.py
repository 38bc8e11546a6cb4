"""Word boxes: the engines' own (RapidOCR's CTC columns, tesseract's TSV), moved to page
pixels by the recognise stage, proportional ones where an engine gives none, and their
round trip through the database."""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw

from ocrfleet import ir
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.models import Document, Page, Run
from ocrfleet.db.persist import load_page_result, save_page_result
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.engines.rapidocr import RapidRecogniser
from ocrfleet.engines.tesseract import TesseractRecogniser
from ocrfleet.pipeline.recognise import recognise
from ocrfleet.pipeline.words import approximate, words_of
from tests.unit.synthetic import font

TEXT = "Invoice granite 4417 harbour"


def drawn_words(text: str, origin: tuple[int, int], size: int = 30) -> list[ir.BBox]:
    """The ink box of each word of `text` drawn at `origin`."""
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    face = font(size)
    boxes, x = [], origin[0]
    for word in text.split(" "):
        x0, y0, x1, y1 = draw.textbbox((x, origin[1]), word, font=face)
        boxes.append(ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1))
        x += round(draw.textlength(word + " ", font=face))
    return boxes


def page_with(text: str, origin: tuple[int, int] = (60, 40)) -> Image.Image:
    image = Image.new("RGB", (900, 120), "white")
    draw = ImageDraw.Draw(image)
    face = font(30)
    x = origin[0]
    for word in text.split(" "):  # word by word, so drawn_words() knows where each went
        draw.text((x, origin[1]), word, font=face, fill="black")
        x += round(draw.textlength(word + " ", font=face))
    return image


def covers(box: ir.BBox, truth: ir.BBox) -> float:
    """Share of the true word's width inside `box`."""
    inside = min(box.x1, truth.x1) - max(box.x0, truth.x0)
    return max(inside, 0) / truth.width


class TextOnly:
    """A recogniser without word boxes (as MiniCPM-OCR will be)."""

    name = "textonly"
    version = "1"

    def recognise(self, crops: list[Image.Image]) -> list[tuple[str, float | None]]:
        return [("Invoice granite\n4417 harbour", 0.5) for _ in crops]


@pytest.fixture(scope="module")
def candidates() -> dict[str, ir.Candidate]:
    page = page_with(TEXT)
    ink = drawn_words(TEXT, (60, 40))
    # one region around the line's ink, as the detector would give (it may split a line)
    box = ir.BBox(x0=ink[0].x0 - 12, y0=ink[0].y0 - 12, x1=ink[-1].x1 + 12, y1=ink[0].y1 + 12)
    regions = [ir.Region(number=1, bbox=box)]
    found = recognise(page, regions, [RapidRecogniser(), TesseractRecogniser(), TextOnly()])
    return {c.engine: c for c in found} | {"region": regions[0]}  # type: ignore[dict-item]


@pytest.mark.parametrize("engine", ["rapidocr", "tesseract"])
def test_engines_place_each_word_on_its_ink(candidates, engine: str) -> None:
    candidate = candidates[engine]
    assert candidate.text == TEXT
    assert [w.text for w in candidate.words] == TEXT.split()
    truth = drawn_words(TEXT, (60, 40))
    region = candidates["region"].bbox
    for word, ink in zip(candidate.words, truth, strict=True):
        assert not word.approximate
        assert word.line == 0
        assert covers(word.bbox, ink) >= 0.8, (engine, word, ink)
        # and not much of the neighbours: a box at most a little wider than its ink
        assert word.bbox.width <= ink.width * 1.5 + 12, (engine, word, ink)
        assert region.x0 <= word.bbox.x0 <= word.bbox.x1 <= region.x1
        assert region.y0 <= word.bbox.y0 <= word.bbox.y1 <= region.y1
        assert word.confidence is not None and 0.5 < word.confidence <= 1.0
    xs = [w.bbox.x0 for w in candidate.words]
    assert xs == sorted(xs)


def test_text_without_boxes_is_placed_by_proportional_width(candidates) -> None:
    candidate = candidates["textonly"]
    region = candidates["region"].bbox
    words = candidate.words
    assert [(w.text, w.line) for w in words] == [
        ("Invoice", 0),
        ("granite", 0),
        ("4417", 1),
        ("harbour", 1),
    ]
    assert all(w.approximate and w.confidence == 0.5 for w in words)
    # two lines: two bands of the region, one above the other
    assert words[0].bbox.y0 == region.y0 and words[-1].bbox.y1 == region.y1
    assert words[0].bbox.y1 <= words[2].bbox.y0 + 1
    # widths in proportion to characters: "Invoice" (7) vs "4417" (4) on lines of 15 and 12
    assert words[0].bbox.x0 == region.x0 and words[3].bbox.x1 == region.x1
    ratio = words[0].bbox.width / region.width
    assert abs(ratio - 7 / 15) < 0.02


def test_approximate_edge_cases() -> None:
    box = ir.BBox(x0=10, y0=20, x1=110, y1=40)
    assert approximate("", box) == []
    assert approximate(" \n \n", box) == []
    (one,) = approximate("word", box)
    assert one.bbox == box
    # a reviewer's text differs from the engine's: its words are placed, not the engine's
    engine = ir.Candidate(
        region_number=1,
        engine="e",
        text="a b",
        words=[ir.Word(text="a", bbox=box), ir.Word(text="b", bbox=box)],
    )
    assert words_of(engine, box) == engine.words
    assert [w.text for w in words_of(engine, box, "a c")] == ["a", "c"]
    assert all(w.approximate for w in words_of(engine, box, "a c"))


def test_words_survive_the_database(tmp_path, candidates) -> None:
    url = f"sqlite:///{tmp_path / 'words.db'}"
    upgrade(url)
    result = ir.PageResult(
        page_number=1,
        regions=[candidates["region"]],
        candidates=[candidates["rapidocr"], candidates["textonly"]],
    )
    try:
        with session_scope(url) as session:
            session.add(Run(id="r" * 64, config={}))
            session.flush()
            doc = Document(run_id="r" * 64, sha256="a" * 64, source_uri="x", status="processing")
            session.add(doc)
            session.flush()
            page = Page(document_id=doc.id, number=1, width=900, height=120, image_uri="x")
            session.add(page)
            session.flush()
            save_page_result(session, page.id, result)
            page_id = page.id
        with session_scope(url) as session:
            assert load_page_result(session, page_id) == result
    finally:
        dispose_engines()


def test_mixed_script_line_gets_a_box_per_word() -> None:
    """rapidocr boxes Chinese per character; words are still the text's own words."""
    from PIL import ImageFont

    face = ImageFont.truetype("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc", 28)
    image = Image.new("RGB", (700, 50), "white")
    draw = ImageDraw.Draw(image)
    x, ink = 10, []
    for word in ["发票号码", "4417", "total", "中文"]:
        draw.text((x, 5), word, fill="black", font=face)
        ink.append(draw.textbbox((x, 5), word, font=face))
        x += round(draw.textlength(word + " ", font=face))
    ((text, _, words),) = RapidRecogniser().recognise_words([image])
    assert text == "发票号码 4417 total 中文"
    assert [w.text for w in words] == text.split()
    for word, (x0, _, x1, _) in zip(words, ink, strict=True):
        inside = min(word.bbox.x1, x1) - max(word.bbox.x0, x0)
        assert inside / (x1 - x0) >= 0.8, (word, (x0, x1))
