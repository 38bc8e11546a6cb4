"""A PDF page's own text (its text layer): taken with the page, judged on evidence, and read
as one more engine's candidates, which the scorer verifies like any other.

The split reads each PDF page's characters through PDFium's text page (`extract`, in the
renderer child, beside the render) and the page PNG carries them in a text chunk
(`page_png`, `read_png`), so a page worker gets them with the image and nothing else is
stored. A page's text layer is used instead of OCR (OCRmyPDF's `--skip-text`, made
verifiable) when `OCRFLEET_TEXT_LAYER=use` (the default) and it is good:

- present: at least `MIN_CHARS` characters on `MIN_LINES` lines;
- decodable: at most `MAX_UNMAPPED` of its characters have no Unicode (PDFium's map error,
  U+FFFD, private-use or control code points: a font without a ToUnicode map reads as
  garbage);
- covers the page's ink: at least `MIN_INK_COVERAGE` of the dark pixels of the rendered page
  lie within its line boxes. Text drawn as pictures (a scan without an OCR layer, a
  chart's labels, a logo with words) leaves ink outside them, and then the page is OCRed.

`redo` OCRs every page whatever its text layer (OCRmyPDF's `--redo-ocr`). The lines become
regions (category text, in reading order; a line across a table's columns one region per
cell) and candidates of engine `pdf-text`, with word boxes from the characters' own; the
scorer re-reads each crop with its readers and decides.
A page whose lines run down, up or right to left (`/Rotate`, sideways content) is turned
upright with its layer first (`direction`, `turned`), so crops are read the right way up.
"""

from __future__ import annotations

import ctypes
import io
import math
import unicodedata
from dataclasses import dataclass

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image, PngImagePlugin

from ocrfleet import ir
from ocrfleet.pipeline.regions import reading_order

__all__ = [
    "ENGINE",
    "Judgement",
    "cells",
    "direction",
    "extract",
    "judge",
    "page_png",
    "read_png",
    "reading",
    "turned",
]

VERSION = 3  # of the extraction, reading and turn below: enters run_id
ENGINE = "pdf-text"
CHUNK = "ocrfleet:text-layer"
MIN_CHARS = 1
MIN_LINES = 1
MAX_UNMAPPED = 0.02
MIN_INK_COVERAGE = 0.80
INK_LEVEL = 128  # a pixel darker than this (0-255 gray) is ink
_BOX_PAD = 0.25  # of a line's height, around its box, for the ink it covers
CELL_GAP = 1.0  # a gap between words wider than this many line heights separates cells
_BREAKS = {"\r", "\n"}
# PDFium's code for a hyphen that ends a line inside a word ("pat-" / "tern"): it gives no
# line break after it, so the word, and the line, would run on over two printed lines.
_LINE_HYPHEN = "\x02"
Affine = tuple[float, float, float, float, float, float]  # page points -> pixels
Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels


def extract(page: pdfium.PdfPage, width: int, height: int) -> ir.TextLayer | None:
    """The page's characters as lines and words in the pixels of its `width` x `height`
    rendering (page rotation and crop box as PDFium renders them); None without text.
    The caller holds the PDFium lock."""
    textpage = page.get_textpage()
    try:
        count = textpage.count_chars()
        if count <= 0:
            return None
        raw = textpage.raw
        to_pixels = _page_to_pixels(page, width, height)
        lines: list[ir.TextLine] = []
        words: list[ir.Word] = []
        word: list[tuple[str, Box]] = []
        unmapped = 0
        for index in range(count):
            code = pdfium_c.FPDFText_GetUnicode(raw, index)
            char = chr(code) if 0 < code < 0x110000 else "\ufffd"
            generated = pdfium_c.FPDFText_IsGenerated(raw, index) == 1
            if not generated and char != _LINE_HYPHEN and _unmapped(raw, index, char):
                unmapped += 1
            if char in _BREAKS or char.isspace():
                _end_word(word, words)
                if char in _BREAKS:
                    _end_line(words, lines)
                continue
            box = _char_box(textpage, index, to_pixels, width, height)
            if char == _LINE_HYPHEN:  # the page shows "-" and the line ends there
                if box is not None:
                    word.append(("-", box))
                _end_word(word, words)
                _end_line(words, lines)
                continue
            if box is not None:
                word.append((char, box))
        _end_word(word, words)
        _end_line(words, lines)
        chars = sum(len(w.text) for line in lines for w in line.words)
        return ir.TextLayer(chars=chars, unmapped=unmapped, lines=lines)
    finally:
        textpage.close()


def _unmapped(raw: object, index: int, char: str) -> bool:
    if pdfium_c.FPDFText_HasUnicodeMapError(raw, index) == 1:
        return True
    category = unicodedata.category(char)
    return char == "\ufffd" or category in ("Co", "Cn", "Cs") or (category == "Cc")


def _page_to_pixels(page: pdfium.PdfPage, width: int, height: int) -> Affine:
    """The map from page points to rendered pixels, as PDFium renders at this size (page
    rotation and crop box included): affine, so three points fix it. Taken 1000 pt apart,
    PDFium's rounding to whole pixels costs under 0.001 px per point."""

    def device(x: float, y: float) -> tuple[int, int]:
        dx, dy = ctypes.c_int(), ctypes.c_int()
        pdfium_c.FPDF_PageToDevice(page.raw, 0, 0, width, height, 0, x, y, dx, dy)
        return dx.value, dy.value

    (ox, oy), (xx, xy), (yx, yy) = device(0, 0), device(1000, 0), device(0, 1000)
    return (
        (xx - ox) / 1000,
        (yx - ox) / 1000,
        float(ox),
        (xy - oy) / 1000,
        (yy - oy) / 1000,
        float(oy),
    )


def _char_box(
    textpage: pdfium.PdfTextPage, index: int, to_pixels: Affine, width: int, height: int
) -> Box | None:
    a, b, c, d, e, f = to_pixels
    left, bottom, right, top = textpage.get_charbox(index, loose=True)
    xs = [a * x + b * y + c for x, y in ((left, bottom), (right, top))]
    ys = [d * x + e * y + f for x, y in ((left, bottom), (right, top))]
    x0, x1 = max(0, math.floor(min(xs))), min(width, math.ceil(max(xs)))
    y0, y1 = max(0, math.floor(min(ys))), min(height, math.ceil(max(ys)))
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


def _union(boxes: list[ir.BBox]) -> ir.BBox:
    return ir.BBox(
        x0=min(b.x0 for b in boxes),
        y0=min(b.y0 for b in boxes),
        x1=max(b.x1 for b in boxes),
        y1=max(b.y1 for b in boxes),
    )


def _end_word(word: list[tuple[str, Box]], words: list[ir.Word]) -> None:
    if word:
        text = "".join(char for char, _ in word)
        x0, y0, x1, y1 = zip(*(box for _, box in word), strict=True)
        bbox = ir.BBox(x0=min(x0), y0=min(y0), x1=max(x1), y1=max(y1))
        words.append(ir.Word(text=text, bbox=bbox))
        word.clear()


def _end_line(words: list[ir.Word], lines: list[ir.TextLine]) -> None:
    if words:
        lines.append(ir.TextLine(bbox=_union([w.bbox for w in words]), words=list(words)))
        words.clear()


# -- the page PNG carries it --------------------------------------------------------------


def page_png(image: Image.Image, layer: ir.TextLayer | None) -> bytes:
    """The page as the store keeps it: PNG at fast compression, and the text layer (if any)
    in a compressed text chunk before the pixels; the same page gives the same bytes."""
    info = None
    if layer is not None:
        info = PngImagePlugin.PngInfo()
        info.add_text(CHUNK, layer.model_dump_json(), zip=True)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1, pnginfo=info)
    return buffer.getvalue()


def read_png(data: bytes) -> ir.TextLayer | None:
    """The text layer a page PNG carries, or None (an image input, a page without text, a
    page stored before text layers were kept). Reads the header only, no pixels."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            value = image.info.get(CHUNK) if image.format == "PNG" else None
    except (OSError, ValueError):
        return None
    return None if value is None else ir.TextLayer.model_validate_json(value)


# -- is it good, and its reading ----------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """Whether a text layer is used, and the evidence: its characters without Unicode, and
    the share of the page's ink inside its line boxes."""

    good: bool
    why: str
    unmapped: float
    coverage: float


def judge(layer: ir.TextLayer | None, page: Image.Image) -> Judgement:
    """Judge `layer` against the rendered `page` (see the module docstring)."""
    if layer is None or layer.chars < MIN_CHARS or len(layer.lines) < MIN_LINES:
        return Judgement(False, "no text layer", 0.0, 0.0)
    unmapped = layer.unmapped / max(1, layer.chars + layer.unmapped)
    coverage = ink_coverage(layer, page)
    why = "good"
    if unmapped > MAX_UNMAPPED:
        why = f"{unmapped:.1%} of its characters have no Unicode"
    elif coverage < MIN_INK_COVERAGE:
        why = f"its lines cover {coverage:.1%} of the ink"
    return Judgement(why == "good", why, unmapped, coverage)


def ink_coverage(layer: ir.TextLayer, page: Image.Image) -> float:
    """The share of the page's dark pixels inside the layer's line boxes (padded by a
    quarter of the line height); 1.0 on a page without ink."""
    ink = np.asarray(page.convert("L")) < INK_LEVEL
    total = int(ink.sum())
    if total == 0:
        return 1.0
    covered = np.zeros_like(ink)
    for line in layer.lines:
        pad = round(_BOX_PAD * line.bbox.height)
        covered[
            max(0, line.bbox.y0 - pad) : line.bbox.y1 + pad,
            max(0, line.bbox.x0 - pad) : line.bbox.x1 + pad,
        ] = True
    return float((ink & covered).sum()) / total


def reading(layer: ir.TextLayer) -> tuple[list[ir.Region], list[ir.Candidate]]:
    """The layer's lines as text regions in reading order, each with its `pdf-text`
    candidate (words in page pixels, no confidence: the layer has none). A line that
    crosses a table's columns is one region per cell (`cells`), in the line's place."""
    lines = [line for line in layer.lines if line.words]
    order = reading_order([line.bbox for line in lines])
    regions, candidates = [], []
    for words in (cell for index in order for cell in cells(lines[index])):
        number = len(regions) + 1
        regions.append(ir.Region(number=number, bbox=_union([word.bbox for word in words])))
        candidates.append(
            ir.Candidate(
                region_number=number,
                engine=ENGINE,
                text=" ".join(word.text for word in words),
                words=words,
            )
        )
    return regions, candidates


def cells(line: ir.TextLine) -> list[list[ir.Word]]:
    """`line`'s words, split where the gap between two is wider than `CELL_GAP` line
    heights: a table row's cells. A crop across such a gap is read without the space (the
    recognisers glue "Lab  Regression" into "LabRegression"), so a right line would be
    doubted. Word gaps in prose are a fraction of a line height; on the olmOCR sample's
    layers, gaps between 0.9 and 1.6 line heights are rare and table columns lie at 1.7
    and over."""
    out = [[line.words[0]]]
    for before, word in zip(line.words, line.words[1:], strict=False):
        if word.bbox.x0 - before.bbox.x1 > CELL_GAP * line.bbox.height:
            out.append([])
        out[-1].append(word)
    return out


# -- which way it runs ------------------------------------------------------------------------


def direction(layer: ir.TextLayer) -> int | None:
    """How far clockwise the page's text is turned (0, 90, 180, 270), from the way its
    lines of two or more words run (first word to last), weighted by their characters;
    None when no such line says."""
    votes = {0: 0, 90: 0, 180: 0, 270: 0}
    for line in layer.lines:
        if len(line.words) < 2:
            continue
        first, last = line.words[0].bbox, line.words[-1].bbox
        dx = (last.x0 + last.x1 - first.x0 - first.x1) / 2
        dy = (last.y0 + last.y1 - first.y0 - first.y1) / 2
        if dx == dy == 0:
            continue
        along = (0 if dx > 0 else 180) if abs(dx) >= abs(dy) else (90 if dy > 0 else 270)
        votes[along] += sum(len(word.text) for word in line.words)
    angle, weight = max(votes.items(), key=lambda item: (item[1], item[0] == 0))
    return angle if weight else None


def turned(layer: ir.TextLayer, angle: int, size: tuple[int, int]) -> ir.TextLayer:
    """`layer` in the pixels of its `size` (width, height) page turned upright from
    `angle` degrees clockwise (as `orient.turn_upright` turns the image)."""
    if angle == 0:
        return layer
    width, height = size

    def box(b: ir.BBox) -> ir.BBox:
        if angle == 90:  # Pillow's ROTATE_90: (x, y) -> (y, width - x)
            return ir.BBox(x0=b.y0, y0=width - b.x1, x1=b.y1, y1=width - b.x0)
        if angle == 180:
            return ir.BBox(x0=width - b.x1, y0=height - b.y1, x1=width - b.x0, y1=height - b.y0)
        return ir.BBox(x0=height - b.y1, y0=b.x0, x1=height - b.y0, y1=b.x1)  # ROTATE_270

    lines = [
        ir.TextLine(
            bbox=box(line.bbox),
            words=[word.model_copy(update={"bbox": box(word.bbox)}) for word in line.words],
        )
        for line in layer.lines
    ]
    return layer.model_copy(update={"lines": lines})
