"""PDF text layers on real PDFs: the bundled letter (fpdf2 text with a real font), the same
page turned by its /Rotate entry, a scan saved as a PDF (no text), and a page whose words
are a picture under a one-line caption (text that covers little of the ink)."""

from __future__ import annotations

import io
from pathlib import Path

import pypdfium2 as pdfium
from fpdf import FPDF
from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.metrics import cer, normalize_ws
from ocrfleet.pipeline import textlayer
from ocrfleet.pipeline.split import iter_pages_with_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LETTER = EXAMPLES / "letter.pdf"
SETTINGS = Settings(_env_file=None)  # type: ignore[call-arg]


def pages(data: bytes) -> list[tuple[Image.Image, ir.TextLayer | None]]:
    return list(iter_pages_with_text(data, SETTINGS))


def layer_text(layer: ir.TextLayer) -> str:
    _, candidates = textlayer.reading(layer)
    return "\n".join(candidate.text for candidate in candidates)


def test_a_text_pdf_is_read_from_its_layer_in_reading_order() -> None:
    truth = (EXAMPLES / "letter.pdf.gt.txt").read_text().split("\f")
    found = pages(LETTER.read_bytes())
    assert len(found) == len(truth)
    for (image, layer), page_truth in zip(found, truth, strict=True):
        assert layer is not None and layer.unmapped == 0
        judged = textlayer.judge(layer, image)
        assert judged.good, judged
        assert judged.coverage > 0.95
        assert cer(normalize_ws(layer_text(layer)), normalize_ws(page_truth)) <= 0.01
        for line in layer.lines:  # every word box lies on the page, inside its line
            assert line.bbox.x1 <= image.width and line.bbox.y1 <= image.height
            for word in line.words:
                assert line.bbox.x0 <= word.bbox.x0 and word.bbox.x1 <= line.bbox.x1


def test_word_boxes_follow_the_page_rotation() -> None:
    pdf = pdfium.PdfDocument(LETTER.read_bytes())
    pdf[0].set_rotation(90)
    out = io.BytesIO()
    pdf.save(out)
    image, layer = pages(out.getvalue())[0]
    assert image.width > image.height  # rendered turned
    judged = textlayer.judge(layer, image)
    assert judged.good and judged.coverage > 0.95, judged


def test_a_turned_page_and_its_layer_are_turned_back_upright() -> None:
    from ocrfleet.pipeline.orient import turn_upright

    upright_image, upright_layer = pages(LETTER.read_bytes())[0]
    assert upright_layer is not None and textlayer.direction(upright_layer) == 0
    for rotation in (90, 180, 270):
        pdf = pdfium.PdfDocument(LETTER.read_bytes())
        pdf[0].set_rotation(rotation)
        out = io.BytesIO()
        pdf.save(out)
        image, layer = pages(out.getvalue())[0]
        assert layer is not None and textlayer.direction(layer) == rotation
        back = textlayer.turned(layer, rotation, image.size)
        assert turn_upright(image, rotation).size == upright_image.size
        assert layer_text(back) == layer_text(upright_layer)
        turned_regions, _ = textlayer.reading(back)
        upright_regions, _ = textlayer.reading(upright_layer)
        for turned_region, region in zip(turned_regions, upright_regions, strict=True):
            a, b = turned_region.bbox, region.bbox
            gaps = (a.x0 - b.x0, a.y0 - b.y0, a.x1 - b.x1, a.y1 - b.y1)
            assert all(abs(gap) <= 2 for gap in gaps), (rotation, a, b)


def test_a_scan_saved_as_pdf_has_no_layer() -> None:
    out = io.BytesIO()
    Image.open(EXAMPLES / "scan.png").convert("RGB").save(out, "PDF", resolution=200.0)
    image, layer = pages(out.getvalue())[0]
    assert layer is None
    assert textlayer.judge(layer, image).why == "no text layer"


def test_text_drawn_as_a_picture_is_not_covered_by_a_caption() -> None:
    pdf = FPDF(format="A4", unit="pt")
    pdf.add_page()
    pdf.image(str(EXAMPLES / "scan.png"), x=40, y=40, w=500)
    pdf.set_font("helvetica", size=10)
    pdf.text(40, 800, "Figure 1: a scanned page")
    image, layer = pages(bytes(pdf.output()))[0]
    assert layer is not None and layer_text(layer) == "Figure 1: a scanned page"
    judged = textlayer.judge(layer, image)
    assert not judged.good and judged.coverage < 0.5, judged


def test_the_layer_rides_in_the_page_png() -> None:
    image, layer = pages(LETTER.read_bytes())[0]
    png = textlayer.page_png(image, layer)
    assert textlayer.read_png(png) == layer
    assert textlayer.page_png(image, layer) == png  # the same page, the same bytes
    assert textlayer.read_png(textlayer.page_png(image, None)) is None


def test_the_mode_and_thresholds_enter_run_id() -> None:
    from ocrfleet.runs import text_layer_config

    use = text_layer_config(SETTINGS)
    redo = text_layer_config(SETTINGS.model_copy(update={"text_layer": "redo"}))
    assert use["mode"] == "use" and redo == {"mode": "redo"}
    assert textlayer.MIN_INK_COVERAGE in use["thresholds"]


def test_a_word_hyphenated_over_two_lines_leaves_them_two_lines() -> None:
    pdf = FPDF(format=(300, 200), unit="pt")
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.text(20, 50, "measuring the distance from a pat-")
    pdf.text(20, 65, "tern to all of the fonts.")
    image, layer = pages(bytes(pdf.output()))[0]
    raw = pdfium.PdfDocument(bytes(pdf.output()))[0].get_textpage().get_text_range()
    assert "pat\ufffetern" in raw  # PDFium joins the word, with no line break (its \x02)
    assert layer is not None and layer.unmapped == 0
    first, second = layer.lines
    assert [w.text for w in first.words][-1] == "pat-"  # as the page shows it
    assert [w.text for w in second.words][0] == "tern"
    assert first.bbox.y1 <= second.bbox.y0 + 2 and textlayer.judge(layer, image).good


def test_a_table_row_is_one_region_per_cell_in_the_rows_place() -> None:
    pdf = FPDF(format=(400, 200), unit="pt")
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.text(20, 40, "A sentence in prose, with its word spaces.")
    pdf.text(20, 60, "Reactor Lab")  # three cells, columns 60 pt (five line heights) apart
    pdf.text(150, 60, "Regression")
    pdf.text(280, 60, "0.87")
    pdf.text(20, 80, "The last line.")
    image, layer = pages(bytes(pdf.output()))[0]
    assert layer is not None and len(layer.lines) == 3  # PDFium keeps the row one line
    regions, candidates = textlayer.reading(layer)
    assert [c.text for c in candidates] == [
        "A sentence in prose, with its word spaces.",
        "Reactor Lab",
        "Regression",
        "0.87",
        "The last line.",
    ]
    for region, candidate in zip(regions, candidates, strict=True):
        assert region.number == candidate.region_number
        assert region.bbox == textlayer._union([w.bbox for w in candidate.words])
    assert regions[1].bbox.x1 < regions[2].bbox.x0 < regions[2].bbox.x1 < regions[3].bbox.x0
