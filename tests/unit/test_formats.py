"""Output formats from stored rows: a real scan through the real pipeline (SQLite, local
store), then the searchable PDF read back with poppler's `pdftotext`, hOCR parsed back,
ALTO validated against the ALTO 4.4 XSD shipped in tests/fixtures/alto, and Markdown of
a page with table and formula regions."""

from __future__ import annotations

import io
import random
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from lxml import etree
from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.db.models import Document, Page, Run
from ocrfleet.db.persist import save_page_result
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.formats import load_document, render
from ocrfleet.formats.pdf import _embeddable
from ocrfleet.pipeline.images import load_image
from ocrfleet.service import Context, ingest, process_page
from tests.conftest import REALDOCS

SCAN = REALDOCS / "tesseract_test" / "phototest.tif"
ALTO_XSD = Path(__file__).resolve().parents[1] / "fixtures" / "alto" / "alto-4-4.xsd"
XLINK_URL = "http://www.loc.gov/standards/xlink/xlink.xsd"
BBOX = re.compile(r"bbox (\d+) (\d+) (\d+) (\d+)")


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory):
    if not SCAN.is_file():
        pytest.skip(f"no real documents under {REALDOCS} (set OCRFLEET_REALDOCS)")
    from ocrfleet.db.migrate import upgrade

    root = tmp_path_factory.mktemp("formats")
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=f"sqlite:///{root / 'ocrfleet.db'}",
        store_url=f"file://{root / 'store'}",
    )
    upgrade(settings.database_url)
    ctx = Context(settings)
    outcome = ingest(ctx, str(SCAN))
    for page_id in outcome.page_ids:
        assert process_page(ctx, page_id) == ir.PageStatus.done
    with ctx.session() as session:
        doc = load_document(session, outcome.document_id)
    yield ctx, doc
    dispose_engines()


def words_of(text: str) -> list[str]:
    return text.split()


def test_searchable_pdf_gives_back_our_text_over_its_pixels(scanned, tmp_path: Path) -> None:
    if shutil.which("pdftotext") is None:
        pytest.fail("pdftotext is missing (Debian: apt-get install poppler-utils)")
    ctx, doc = scanned
    pdf = tmp_path / "doc.pdf"
    pdf.write_bytes(render(doc, "pdf", ctx.store))
    extracted = subprocess.run(
        ["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True
    ).stdout
    ours = Counter(words_of(render(doc, "text").decode()))
    theirs = Counter(words_of(extracted))
    recall = sum((ours & theirs).values()) / sum(ours.values())
    assert sum(ours.values()) > 50
    assert recall >= 0.99, (recall, ours - theirs)

    # Word boxes from the PDF, back in page pixels, sit on dark pixels of the page image.
    page = doc.pages[0]
    image = load_image(ctx.store.get(ctx.store.key_of(page.image_uri))).convert("L")
    xml = subprocess.run(
        ["pdftotext", "-bbox", str(pdf), "-"], capture_output=True, text=True, check=True
    ).stdout
    found = etree.fromstring(xml.encode(), etree.XMLParser(recover=True))
    page_el = found.find(".//{*}page")
    to_px = page.width / float(page_el.get("width"))
    boxes = [
        (w.text, [float(w.get(k)) * to_px for k in ("xMin", "yMin", "xMax", "yMax")])
        for w in page_el.iter("{*}word")
    ]
    stored = {(w.text, w.bbox.as_tuple()) for r in page.regions for w in r.words}
    assert len(boxes) == len(stored)
    for text, (x0, y0, x1, y1) in random.Random(0).sample(boxes, 25):
        crop = np.asarray(image.crop((round(x0), round(y0), round(x1), round(y1))))
        dark = float((crop < 128).mean()) if crop.size else 0.0
        assert dark > 0.05, (text, (x0, y0, x1, y1), dark)
        # and over the word of that text in our own boxes (most of it, not a neighbour)
        best = max(
            (overlap((x0, y0, x1, y1), box) for word, box in stored if word == text), default=0
        )
        assert best > 0.6, (text, (x0, y0, x1, y1))


def test_pdf_page_image_is_the_stored_page_in_fewest_channels(scanned) -> None:
    """phototest.tif is black and white: stored as RGB, it goes into the PDF as CCITT G4
    with the same pixels."""
    import pikepdf
    from pikepdf import PdfImage

    ctx, doc = scanned
    page = doc.pages[0]
    stored = load_image(ctx.store.get(ctx.store.key_of(page.image_uri)))
    with pikepdf.open(io.BytesIO(render(doc, "pdf", ctx.store))) as pdf:
        (raw,) = pdf.pages[0].get_images().values()
        assert raw.Filter == "/CCITTFaxDecode"
        embedded = PdfImage(raw).as_pil_image()
    assert embedded.size == stored.size
    assert np.array_equal(np.asarray(embedded.convert("L")), np.asarray(stored.convert("L")))


@pytest.mark.parametrize("kind", ["colour", "grey", "jpeg"])
def test_pdf_page_image_has_the_stored_pixels(kind: str) -> None:
    """Each way a page image goes into the PDF (a colour PNG's own compressed pixels,
    greyscale, a JPEG's own bytes; CCITT G4 is the test above, on a real scan) decodes to
    the stored page's pixels."""
    import pikepdf
    from pikepdf import PdfImage

    from ocrfleet.formats import pdf as searchable
    from ocrfleet.formats.document import DocumentView, PageView
    from ocrfleet.pipeline.images import encode_png

    rng = np.random.default_rng(5)
    grey = rng.integers(0, 256, (50, 70), dtype=np.uint8)
    pixels = {
        "colour": rng.integers(0, 256, (50, 70, 3), dtype=np.uint8),
        "grey": np.repeat(grey[..., None], 3, axis=2),
        "jpeg": rng.integers(0, 256, (50, 70, 3), dtype=np.uint8),
    }[kind]
    if kind == "jpeg":
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG")
        stored = out.getvalue()
        pixels = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB"))
    else:
        stored = encode_png(Image.fromarray(pixels))
    page = PageView(1, 70, 50, "done", None, "x", [])
    doc = DocumentView(1, "r", "0" * 64, "x", None, "done", None, 1, 1, 0, None, 200, [page])
    with pikepdf.open(io.BytesIO(searchable.render(doc, lambda _: stored))) as pdf:
        (raw,) = pdf.pages[0].get_images().values()
        expected = {
            "colour": "/FlateDecode",
            "grey": "/FlateDecode",
            "jpeg": "/DCTDecode",
        }[kind]
        assert raw.Filter == expected
        embedded = PdfImage(raw).as_pil_image()
        own_bytes = raw.read_raw_bytes() == stored
    assert embedded.mode == {"colour": "RGB", "grey": "L", "jpeg": "RGB"}[kind]
    assert own_bytes == (kind == "jpeg")
    assert np.array_equal(np.asarray(embedded.convert("RGB")), pixels)


def test_page_images_keep_their_pixels_in_fewer_channels() -> None:
    rng = np.random.default_rng(3)
    grey = rng.integers(0, 256, (40, 60), dtype=np.uint8)
    bilevel = np.where(grey > 128, 255, 0).astype(np.uint8)
    colour = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    for pixels, mode in ((grey, "L"), (bilevel, "1"), (colour, "RGB")):
        rgb = Image.fromarray(pixels).convert("RGB")
        out = _embeddable(_png(rgb))
        assert out.mode == mode
        assert np.array_equal(np.asarray(out.convert("RGB")), np.asarray(rgb))
    jpeg = io.BytesIO()
    Image.fromarray(colour).save(jpeg, format="JPEG")
    assert _embeddable(jpeg.getvalue()).getvalue() == jpeg.getvalue()  # its own bytes


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_pdf_text_layer_gives_back_any_script_and_markup_as_written(tmp_path: Path) -> None:
    """The glyphless font draws every character the same blank way and maps it back to
    itself: CJK, accents, a character beyond the BMP and markup come out of `pdftotext` as
    the words were, each where its box is; the title (a tenant's filename) is a string."""
    from ocrfleet.formats import pdf as searchable
    from ocrfleet.formats.document import DocumentView, PageView, RegionView

    words = ["漢字テキスト", "naïve", "Ünïcödé", "<script>alert(1)</script>", "(paren", "𝔘nicode"]
    placed = [
        ir.Word(
            text=t,
            bbox=ir.BBox(
                x0=40 + 260 * (i % 2),
                y0=40 + 60 * (i // 2),
                x1=280 + 260 * (i % 2),
                y1=80 + 60 * (i // 2),
            ),
            line=i // 2,
        )
        for i, t in enumerate(words)
    ]
    region = RegionView(
        region=ir.Region(number=1, bbox=ir.BBox(x0=0, y0=0, x1=600, y1=240)),
        text=" ".join(words),
        words=placed,
        engine="rapidocr",
        confidence=0.9,
        decision=None,
        review=None,
        candidates=[],
        scores=[],
    )
    page = PageView(1, 600, 240, "done", None, "x", [region])
    title = "<b>) /JS (app.alert(1)) >>.pdf"
    doc = DocumentView(
        1, "r", "0" * 64, "x", None, "done", None, 1, 1, 0, {"filename": title}, 200, [page]
    )
    path = tmp_path / "scripts.pdf"
    path.write_bytes(searchable.render(doc, lambda _: _png(Image.new("RGB", (600, 240), "white"))))
    extracted = subprocess.run(
        ["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True, check=True
    ).stdout
    assert extracted.split() == words, extracted
    info = subprocess.run(["pdfinfo", str(path)], capture_output=True, text=True, check=True)
    assert f"Title:           {title}" in info.stdout.splitlines()
    xml = subprocess.run(
        ["pdftotext", "-bbox", str(path), "-"], capture_output=True, text=True, check=True
    ).stdout
    found = etree.fromstring(xml.encode(), etree.XMLParser(recover=True))
    to_px = 600 / float(found.find(".//{*}page").get("width"))
    for element, word in zip(found.iter("{*}word"), placed, strict=True):
        x0, y0, x1, y1 = (float(element.get(k)) * to_px for k in ("xMin", "yMin", "xMax", "yMax"))
        assert overlap((x0, y0, x1, y1), word.bbox.as_tuple()) > 0.8, (word.text, (x0, y0, x1, y1))


def overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    """Intersection over the area of `a`."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    area = (a[2] - a[0]) * (a[3] - a[1])
    return max(w, 0) * max(h, 0) / area if area > 0 else 0.0


def box_of(element: etree._Element) -> tuple[int, int, int, int]:
    found = BBOX.search(element.get("title"))
    assert found, element.get("title")
    x0, y0, x1, y1 = (int(v) for v in found.groups())
    return x0, y0, x1, y1


def inside(inner: tuple[int, ...], outer: tuple[int, ...]) -> bool:
    x_in = outer[0] <= inner[0] <= inner[2] <= outer[2]
    return x_in and outer[1] <= inner[1] <= inner[3] <= outer[3]


def test_hocr_parses_back_with_words_inside_their_lines(scanned) -> None:
    _, doc = scanned
    root = etree.fromstring(render(doc, "hocr"))
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    pages = root.findall(".//h:div[@class='ocr_page']", ns)
    assert len(pages) == 1
    page_box = box_of(pages[0])
    assert page_box == (0, 0, doc.pages[0].width, doc.pages[0].height)
    words = []
    for area in pages[0].findall("h:div[@class='ocr_carea']", ns):
        assert inside(box_of(area), page_box)
        for line in area.findall("h:span[@class='ocr_line']", ns):
            assert inside(box_of(line), box_of(area))
            for word in line.findall("h:span[@class='ocrx_word']", ns):
                assert inside(box_of(word), box_of(line)), (word.text, word.get("title"))
                conf = re.search(r"x_wconf (\d+)", word.get("title"))
                assert conf and 0 <= int(conf.group(1)) <= 100
                words.append(word.text)
    assert words == words_of(render(doc, "text").decode())


def alto_schema() -> etree.XMLSchema:
    """The ALTO 4.4 XSD; its xlink import resolves to the copy beside it, never the network."""

    class Local(etree.Resolver):
        def resolve(self, url, pubid, context):  # noqa: ANN001, ANN201
            if url == XLINK_URL:
                return self.resolve_filename(str(ALTO_XSD.with_name("xlink.xsd")), context)
            return None

    parser = etree.XMLParser(no_network=True)
    parser.resolvers.add(Local())
    return etree.XMLSchema(etree.parse(str(ALTO_XSD), parser))


def test_alto_validates_against_the_xsd(scanned) -> None:
    _, doc = scanned
    schema = alto_schema()
    alto = etree.fromstring(render(doc, "alto"))
    schema.assertValid(alto)
    strings = [s.get("CONTENT") for s in alto.iter("{*}String")]
    assert strings == words_of(render(doc, "text").decode())
    # the schema is a real check: a String without CONTENT is refused
    next(alto.iter("{*}String")).attrib.pop("CONTENT")
    assert not schema.validate(alto)


def test_json_has_pages_regions_words_and_verdicts(scanned) -> None:
    import json

    _, doc = scanned
    data = json.loads(render(doc, "json"))
    assert data["status"] == "done" and data["text"] == render(doc, "text").decode()
    (page,) = data["pages"]
    assert page["text"] + "\n" == data["text"]  # one page: the text format adds its newline
    for region in page["regions"]:
        assert " ".join(w["text"] for w in region["words"]) == " ".join(region["text"].split())
        assert region["accepted"] in (True, False)
        assert (region["flag"] is None) == region["accepted"]
        (candidate,) = region["candidates"]
        assert candidate["scores"][0]["verdict"] in {v.value for v in ir.Verdict}


def test_markdown_of_a_page_with_table_and_formula_regions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'md.db'}"
    from ocrfleet.db.migrate import upgrade

    upgrade(url)
    box = ir.BBox(x0=0, y0=0, x1=100, y1=20)
    table = ir.Region(number=2, category=ir.Category.table, bbox=box)
    result = ir.PageResult(
        page_number=1,
        regions=[
            ir.Region(number=1, bbox=box),
            table,
            ir.Region(number=3, category=ir.Category.formula, bbox=box),
            ir.Region(number=4, category=ir.Category.table, bbox=box),
        ],
        candidates=[
            ir.Candidate(region_number=1, engine="rapidocr", text="Quarterly totals"),
            ir.Candidate(
                region_number=2, engine="rapidocr", text="Item  Qty  Price\nBolts  40  1.20"
            ),
            ir.Candidate(region_number=3, engine="rapidocr", text=r"E = mc^2"),
            ir.Candidate(
                region_number=4,
                engine="rapidocr",
                text="<table><tr><td>a</td><td>b</td></tr></table>",
            ),
        ],
    )
    try:
        with session_scope(url) as session:
            session.add(Run(id="r" * 64, config={"dpi": 100}))
            session.flush()
            doc = Document(run_id="r" * 64, sha256="b" * 64, source_uri="x", status="done")
            session.add(doc)
            session.flush()
            page = Page(
                document_id=doc.id, number=1, width=100, height=100, image_uri="x", status="done"
            )
            session.add(page)
            session.flush()
            save_page_result(session, page.id, result)
            markdown = render(load_document(session, doc.id), "markdown").decode()
    finally:
        dispose_engines()
    assert markdown.startswith("Quarterly totals\n\n")
    assert "| Item | Qty | Price |\n| --- | --- | --- |\n| Bolts | 40 | 1.20 |" in markdown
    assert "$$\nE = mc^2\n$$" in markdown
    assert "<table><tr><td>a</td><td>b</td></tr></table>" in markdown


def test_unknown_format_is_refused(scanned) -> None:
    _, doc = scanned
    with pytest.raises(ValueError, match="unknown format"):
        render(doc, "docx")
    with pytest.raises(ValueError, match="object store"):
        render(doc, "pdf")
