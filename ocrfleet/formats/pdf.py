"""Searchable PDF: each page image at its rendering resolution, with an invisible text
layer (PDF text render mode 3) that puts every word over its pixels: font size from the
word box's height, horizontal stretching to its width, so selecting, searching and
`pdftotext` give our text at the right places. Reviewed text is placed proportionally."""

from __future__ import annotations

import io
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.formats.document import DocumentView, PageView

if TYPE_CHECKING:
    from fpdf import FPDF

MEDIA_TYPE = "application/pdf"
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
# For glyphs DejaVu lacks (CJK, full-width forms): the renderer's CJK font, where installed.
FALLBACK_FONT = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
# DejaVu Sans: ascent 0.928 and descent 0.236 of the em. A word box spans ascent + descent
# of its line's tallest glyphs, so one em is the box height over their sum.
_ASCENT, _DESCENT = 0.928, 0.236

# The page image (PNG or JPEG bytes) of a page.
PageImages = Callable[[PageView], bytes]


def render(doc: DocumentView, images: PageImages) -> bytes:
    # fpdf is imported here, not with the module: it adds ~50 MB to a process, and every
    # process that loads the formats (`ocrfleet run`, a worker) would carry it.
    from fpdf import FPDF
    from fpdf.enums import TextMode

    if not FONT.is_file():
        raise FileNotFoundError(
            f"the PDF text layer font {FONT} is missing (Debian: apt-get install fonts-dejavu-core)"
        )
    pdf = FPDF(unit="pt")
    pdf.set_auto_page_break(False)
    pdf.set_margin(0)
    pdf.set_creator("ocrfleet")
    pdf.set_title(doc.filename or doc.sha256)
    pdf.add_font("text-layer", fname=str(FONT))
    scale = 72.0 / doc.dpi
    for page in doc.pages:
        width, height = page.width * scale, page.height * scale
        pdf.add_page(format=(width, height))
        pdf.image(_embeddable(images(page)), x=0, y=0, w=width, h=height)
        pdf.text_mode = TextMode.INVISIBLE
        for region in page.regions:
            for line in region.lines:
                following = [w.bbox.x0 for w in line.words[1:]] + [None]
                for word, next_x0 in zip(line.words, following, strict=True):
                    _place(pdf, word, scale, next_x0)
        pdf.text_mode = TextMode.FILL
        pdf.set_stretching(100)
    return bytes(pdf.output())


def _embeddable(data: bytes) -> io.BytesIO | Image.Image:
    """The page image as the PDF stores it: a JPEG's own bytes; an image whose colour is
    grey in every pixel as greyscale, and one of black and white only as a bilevel image
    (CCITT G4). Pages are stored as RGB, and fpdf zlib-compresses every pixel it is
    given: a scan's page costs a third of the work as greyscale and almost none as G4."""
    image = Image.open(io.BytesIO(data))
    if image.format == "JPEG":
        return io.BytesIO(data)
    if image.mode == "RGB":
        rgb = np.asarray(image)
        if not ((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()):
            return image
        image = Image.fromarray(rgb[..., 0])
    if image.mode == "L":
        grey = np.asarray(image)
        if ((grey == 0) | (grey == 255)).all():
            return image.convert("1", dither=Image.Dither.NONE)
    return image


def _family(pdf: FPDF, text: str) -> str:
    """DejaVu, or the fallback font (added on first need) for text with glyphs DejaVu
    lacks, so those words are extracted as written rather than dropped."""
    if all(ord(char) in _dejavu_cmap() for char in text) or not FALLBACK_FONT.is_file():
        return "text-layer"
    if "text-layer-cjk" not in pdf.fonts:
        pdf.add_font("text-layer-cjk", fname=str(FALLBACK_FONT))
    return "text-layer-cjk"


@cache
def _dejavu_cmap() -> frozenset[int]:
    from fontTools.ttLib import TTFont

    return frozenset(TTFont(str(FONT)).getBestCmap())


def _place(pdf: FPDF, word: ir.Word, scale: float, next_x0: int | None) -> None:
    """The word stretched over its box, then, unless it ends its line, a space that ends
    before the next word starts (squeezing the word if the boxes touch): text extraction
    splits words at spaces, and drops a space that overlaps the next glyph."""
    box = word.bbox
    if not word.text or box.width == 0 or box.height == 0:
        return
    size = box.height * scale / (_ASCENT + _DESCENT)
    pdf.set_font(_family(pdf, word.text), size=size)
    pdf.set_stretching(100)
    natural = pdf.get_string_width(word.text)
    if natural <= 0:
        return
    stretch = box.width / natural
    text = word.text
    if next_x0 is not None:
        text += " "
        with_space = pdf.get_string_width(text)
        stretch = min(stretch, max(next_x0 - box.x0, 1) / with_space)
    pdf.set_stretching(100 * stretch * scale)
    pdf.text(box.x0 * scale, box.y1 * scale - _DESCENT * size, text)
