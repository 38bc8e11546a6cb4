"""Searchable PDF: each page image at its rendering resolution, with an invisible text
layer (PDF text render mode 3) that puts every word over its pixels: font size from the
word box's height, horizontal scaling to its width, so selecting, searching and
`pdftotext` give our text at the right places. Reviewed text is placed proportionally.

The text layer's font is glyphless, as in tesseract's and OCRmyPDF's PDFs: every character
is the same blank glyph half an em wide, and the ToUnicode map gives back the character
itself. Text of any script goes in as written, and writing a page costs no font to parse,
measure or subset (a real font's took ~0.2 s a page)."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.formats.document import DocumentView, PageView

if TYPE_CHECKING:
    import pikepdf

MEDIA_TYPE = "application/pdf"
# The glyph's advance, ascent and descent in thousandths of an em. A word box spans its
# line's ascent and descent, so one em is the box's height and the baseline sits a fifth
# of it above the box's bottom.
_ADVANCE, _ASCENT, _DESCENT = 500, 800, 200

# The page image (PNG or JPEG bytes) of a page.
PageImages = Callable[[PageView], bytes]


def render(doc: DocumentView, images: PageImages) -> bytes:
    # pikepdf is imported where a PDF is written, not with the module: every process that
    # loads the formats (`ocrfleet run`, the API) would carry its ~12 MB.
    import pikepdf
    from pikepdf import Array, Dictionary, Name

    pdf = pikepdf.new()
    pdf.docinfo[Name.Creator] = "ocrfleet"
    pdf.docinfo[Name.Title] = doc.filename or doc.sha256
    font, codes = _glyphless_font(pdf), _Codes()
    scale = 72.0 / doc.dpi
    for page in doc.pages:
        width, height = page.width * scale, page.height * scale
        image = _image_xobject(pdf, images(page))
        ops = [f"q {_num(width)} 0 0 {_num(height)} 0 0 cm /Im0 Do Q", "BT 3 Tr"]
        for region in page.regions:
            for line in region.lines:
                following = [w.bbox.x0 for w in line.words[1:]] + [None]
                for word, next_x0 in zip(line.words, following, strict=True):
                    ops.extend(_placed(word, codes, scale, height, next_x0))
        ops.append("ET")
        resources = Dictionary(XObject=Dictionary(Im0=image), Font=Dictionary(F0=font))
        pdf.pages.append(
            pikepdf.Page(
                Dictionary(
                    Type=Name.Page,
                    MediaBox=Array([0, 0, width, height]),
                    Resources=resources,
                    Contents=_flate_stream(pdf, "\n".join(ops).encode("ascii")),
                )
            )
        )
    font.ToUnicode = _flate_stream(pdf, codes.to_unicode())
    out = io.BytesIO()
    pdf.save(out, deterministic_id=True, stream_decode_level=pikepdf.StreamDecodeLevel.none)
    return out.getvalue()


def _placed(
    word: ir.Word, codes: _Codes, scale: float, page_height: float, next_x0: int | None
) -> list[str]:
    """The operators that stretch the word over its box, then, unless it ends its line, a
    space that ends before the next word starts (squeezing the word if the boxes touch):
    text extraction splits words at spaces, and drops a space that overlaps the next glyph."""
    box = word.bbox
    if not word.text or box.width == 0 or box.height == 0:
        return []
    size = box.height * scale
    text = word.text
    stretch = box.width * scale / (len(text) * size * _ADVANCE / 1000)
    if next_x0 is not None:
        text += " "
        room = max(next_x0 - box.x0, 1) * scale
        stretch = min(stretch, room / (len(text) * size * _ADVANCE / 1000))
    x, y = box.x0 * scale, page_height - box.y1 * scale + size * _DESCENT / 1000
    return [
        f"/F0 {_num(size)} Tf {_num(100 * stretch)} Tz 1 0 0 1 {_num(x)} {_num(y)} Tm",
        f"<{codes.encode(text).hex()}> Tj",
    ]


class _Codes:
    """The text layer's character codes, two bytes each, one per character: a character of
    the Basic Multilingual Plane is its own code; one beyond it takes a code of the
    surrogate range (which no character is), and the ToUnicode map gives it back."""

    def __init__(self) -> None:
        self.beyond: dict[str, int] = {}

    def encode(self, text: str) -> bytes:
        return b"".join(self._code(char).to_bytes(2, "big") for char in text)

    def _code(self, char: str) -> int:
        point = ord(char)
        if point <= 0xFFFF:
            return 0xFFFD if 0xD800 <= point <= 0xDFFF else point
        if char not in self.beyond and len(self.beyond) < 0x800:
            self.beyond[char] = 0xD800 + len(self.beyond)
        return self.beyond.get(char, 0xFFFD)

    def to_unicode(self) -> bytes:
        """The CMap from codes back to text: the two ranges of the plane that are their own
        characters, then the surrogate codes given out, a hundred to a block."""
        lines = [_CMAP_HEAD, "2 beginbfrange", "<0000> <D7FF> <0000>", "<E000> <FFFF> <E000>"]
        lines.append("endbfrange")
        given = sorted(self.beyond.items(), key=lambda item: item[1])
        for start in range(0, len(given), 100):
            block = given[start : start + 100]
            lines.append(f"{len(block)} beginbfchar")
            lines += [
                f"<{code:04X}> <{char.encode('utf-16-be').hex().upper()}>" for char, code in block
            ]
            lines.append("endbfchar")
        lines.append(_CMAP_TAIL)
        return "\n".join(lines).encode("ascii")


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


def _embeddable(data: bytes) -> io.BytesIO | Image.Image:
    """The page image as the PDF stores it: a JPEG's own bytes; an image whose colour is
    grey in every pixel as greyscale, and one of black and white only as a bilevel image
    (CCITT G4). Pages are stored as RGB, and every pixel of a Flate image is compressed:
    a scan's page costs a third of the work as greyscale and almost none as G4."""
    image = Image.open(io.BytesIO(data))
    if image.format == "JPEG" and image.mode in ("L", "RGB"):
        return io.BytesIO(data)
    if image.mode not in ("1", "L", "RGB"):
        image = image.convert("RGB")
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


def _image_xobject(pdf: pikepdf.Pdf, data: bytes) -> pikepdf.Stream:
    from pikepdf import Dictionary, Name

    image = _embeddable(data)
    if isinstance(image, io.BytesIO):
        with Image.open(image) as jpeg:
            size, mode = jpeg.size, jpeg.mode
        return _xobject(pdf, image.getvalue(), size, mode, Name.DCTDecode)
    if image.mode == "1":
        coded = _group4(image)
        if coded is not None:
            g4, black_is_1 = coded
            parms = Dictionary(K=-1, Columns=image.width, Rows=image.height, BlackIs1=black_is_1)
            return _xobject(pdf, g4, image.size, "1", Name.CCITTFaxDecode, parms)
        image = image.convert("L")
    if image.mode == "RGB" and (png := _png_rgb(data)) is not None:
        parms = Dictionary(Predictor=15, Colors=3, BitsPerComponent=8, Columns=image.width)
        return _xobject(pdf, png, image.size, "RGB", Name.FlateDecode, parms)
    pixels = zlib.compress(image.tobytes())
    return _xobject(pdf, pixels, image.size, image.mode, Name.FlateDecode)


def _png_rgb(data: bytes) -> bytes | None:
    """The compressed pixels of a PNG of 8-bit RGB, not interlaced (what a colour page is
    stored as): a Flate stream with PNG predictors, as a PDF image takes it, so a colour
    page goes in as stored instead of compressed again. None for any other image."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    position, chunks, header = 8, [], None
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body = data[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
        position += 12 + length
    if header is None or header[2:] != (8, 2, 0, 0, 0) or not chunks:
        return None
    return b"".join(chunks)


def _xobject(
    pdf: pikepdf.Pdf,
    data: bytes,
    size: tuple[int, int],
    mode: str,
    encoding: pikepdf.Name,
    parms: pikepdf.Dictionary | None = None,
) -> pikepdf.Stream:
    from pikepdf import Name, Stream

    stream = Stream(pdf, b"")
    stream.write(data, filter=encoding, decode_parms=parms)
    stream.Type, stream.Subtype = Name.XObject, Name.Image
    stream.Width, stream.Height = size
    stream.ColorSpace = Name.DeviceRGB if mode == "RGB" else Name.DeviceGray
    stream.BitsPerComponent = 1 if mode == "1" else 8
    return pdf.make_indirect(stream)


def _group4(image: Image.Image) -> tuple[bytes, bool] | None:
    """The bilevel image as one strip of CCITT G4, as Pillow's TIFF writer codes it, and
    whether its black is 1 (the TIFF's photometric interpretation); None where this Pillow
    has no libtiff."""
    from PIL import TiffImagePlugin, features

    if not features.check("libtiff"):
        return None
    out = io.BytesIO()
    one_strip = {TiffImagePlugin.ROWSPERSTRIP: image.height}
    image.save(out, format="TIFF", compression="group4", tiffinfo=one_strip)
    with Image.open(out) as tiff:
        tags = tiff.tag_v2
        offsets, counts = tags[TiffImagePlugin.STRIPOFFSETS], tags[TiffImagePlugin.STRIPBYTECOUNTS]
        photometric = tags[TiffImagePlugin.PHOTOMETRIC_INTERPRETATION]
        if len(offsets) != 1 or tags.get(TiffImagePlugin.FILLORDER, 1) != 1:
            return None
    return out.getvalue()[offsets[0] : offsets[0] + counts[0]], photometric == 1


def _flate_stream(pdf: pikepdf.Pdf, data: bytes) -> pikepdf.Stream:
    from pikepdf import Name, Stream

    stream = Stream(pdf, b"")
    stream.write(zlib.compress(data), filter=Name.FlateDecode)
    return pdf.make_indirect(stream)


def _glyphless_font(pdf: pikepdf.Pdf) -> pikepdf.Object:
    """A Type 0 font of two-byte codes (Identity-H), every one drawn with the blank glyph
    of `_glyphless_truetype`; its ToUnicode map is `_Codes`', added once the text is in."""
    from pikepdf import Array, Dictionary, Name, String

    descriptor = Dictionary(
        Type=Name.FontDescriptor,
        FontName=Name.GlyphLessFont,
        Flags=5,  # fixed pitch, symbolic
        FontBBox=Array([0, -_DESCENT, _ADVANCE, _ASCENT]),
        ItalicAngle=0,
        Ascent=_ASCENT,
        Descent=-_DESCENT,
        CapHeight=_ASCENT,
        StemV=80,
        FontFile2=_flate_stream(pdf, _glyphless_truetype()),
    )
    every_code_to_glyph_1 = b"\x00\x01" * 65536
    cid_font = Dictionary(
        Type=Name.Font,
        Subtype=Name.CIDFontType2,
        BaseFont=Name.GlyphLessFont,
        CIDSystemInfo=Dictionary(
            Registry=String("Adobe"), Ordering=String("Identity"), Supplement=0
        ),
        FontDescriptor=pdf.make_indirect(descriptor),
        DW=_ADVANCE,
        CIDToGIDMap=_flate_stream(pdf, every_code_to_glyph_1),
    )
    return pdf.make_indirect(
        Dictionary(
            Type=Name.Font,
            Subtype=Name.Type0,
            BaseFont=Name.GlyphLessFont,
            Encoding=Name("/Identity-H"),
            DescendantFonts=Array([pdf.make_indirect(cid_font)]),
        )
    )


_CMAP_HEAD = """/CIDInit /ProcSet findresource begin
12 dict begin
begincmap
/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def
/CMapName /Adobe-Identity-UCS def
/CMapType 2 def
1 begincodespacerange
<0000> <FFFF>
endcodespacerange"""
_CMAP_TAIL = """endcmap
CMapName currentdict /CMap defineresource pop
end
end"""


@cache
def _glyphless_truetype() -> bytes:
    """A TrueType font of two empty glyphs (`.notdef` and the one every code draws)."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    builder = FontBuilder(1000, isTTF=True)
    builder.setupGlyphOrder([".notdef", "blank"])
    builder.setupCharacterMap({})
    empty = TTGlyphPen(None).glyph()
    builder.setupGlyf({".notdef": empty, "blank": empty})
    builder.setupHorizontalMetrics({".notdef": (_ADVANCE, 0), "blank": (_ADVANCE, 0)})
    builder.setupHorizontalHeader(ascent=_ASCENT, descent=-_DESCENT)
    builder.setupNameTable({"familyName": "GlyphLessFont", "styleName": "Regular"})
    builder.setupOS2(
        sTypoAscender=_ASCENT, sTypoDescender=-_DESCENT, usWinAscent=_ASCENT, usWinDescent=_DESCENT
    )
    builder.setupPost()
    out = io.BytesIO()
    builder.save(out)
    return out.getvalue()
