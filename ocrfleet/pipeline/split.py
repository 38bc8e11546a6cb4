"""Page split: the one loader for every input (PDF or image), from bytes to RGB page images.

`open_document` validates an input against the settings' limits before any page is
rendered or decoded; `iter_pages` then yields the pages one at a time. Anything wrong with
the input raises `InputRejected` with a stable reason code; nothing here crashes on bad bytes.

PDFium is not thread-safe: every call into it here holds one process-wide lock, and a
worker should render one document at a time per process.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterator

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from PIL import Image

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.pipeline import textlayer
from ocrfleet.pipeline.images import (
    InputRejected,
    check_pixels,
    image_media_type,
    iter_frames,
    probe_image,
)

__all__ = [
    "PDF",
    "InputRejected",
    "iter_pages",
    "iter_pages_with_text",
    "open_document",
    "pdf_page_pixels",
    "sniff_media_type",
]

PDF = "application/pdf"
_PDF_MAGIC_WINDOW = 1024  # PDF readers accept junk before "%PDF-" within the first 1 KiB
_EOF_WINDOW = 1024  # and want "%%EOF" within the last 1 KiB (PDF 1.7, implementation note 18)
_PDFIUM_LOCK = threading.RLock()
_PDFIUM_ERRORS = {
    pdfium_c.FPDF_ERR_UNKNOWN: "unknown error",
    pdfium_c.FPDF_ERR_FILE: "file error",
    pdfium_c.FPDF_ERR_FORMAT: "not a PDF or corrupted",
    pdfium_c.FPDF_ERR_PAGE: "page not found or content error",
}


def sniff_media_type(data: bytes) -> str:
    """The media type from the magic bytes; the file name and any declared type are ignored.

    Image signatures sit at byte 0 and are checked first, so a PNG whose text chunk says
    "%PDF-" stays a PNG; a PDF may have junk before its header, as readers allow."""
    media_type = image_media_type(data)
    if media_type is not None:
        return media_type
    if b"%PDF-" in data[:_PDF_MAGIC_WINDOW]:
        return PDF
    raise InputRejected(
        "unsupported_type",
        f"not a PDF, PNG, JPEG, TIFF, GIF, WebP or BMP file (first bytes: {data[:8].hex(' ')})",
    )


def open_document(data: bytes, settings: Settings, source_uri: str) -> ir.Document:
    """Validate an input against every limit and describe it; renders and decodes nothing."""
    _check_bytes(data, settings)
    media_type = sniff_media_type(data)
    if media_type == PDF:
        page_count = _probe_pdf(data, settings)
    else:
        _, page_count = probe_image(data, max_pixels=settings.max_pixels)
        _check_page_count(page_count, settings)
    return ir.Document(
        sha256=hashlib.sha256(data).hexdigest(),
        source_uri=source_uri,
        media_type=media_type,
        byte_size=len(data),
        page_count=page_count,
    )


def iter_pages(data: bytes, settings: Settings) -> Iterator[Image.Image]:
    """The pages as RGB images, one at a time: PDF pages rendered at `settings.dpi`, image
    frames (TIFF, GIF) decoded at their own size. Limits are checked again page by page,
    so this is safe on bytes that skipped `open_document`."""
    for image, _ in _iter_pages(data, settings, text=False):
        yield image


def iter_pages_with_text(
    data: bytes, settings: Settings
) -> Iterator[tuple[Image.Image, ir.TextLayer | None]]:
    """As `iter_pages`, with each PDF page's text layer in the image's pixels (None for an
    image input and a page without text; see ocrfleet.pipeline.textlayer)."""
    yield from _iter_pages(data, settings, text=True)


def _iter_pages(
    data: bytes, settings: Settings, *, text: bool
) -> Iterator[tuple[Image.Image, ir.TextLayer | None]]:
    _check_bytes(data, settings)
    if sniff_media_type(data) == PDF:
        yield from _render_pdf(data, settings, text)
        return
    _, page_count = probe_image(data, max_pixels=settings.max_pixels)
    _check_page_count(page_count, settings)
    for image in iter_frames(data, max_pixels=settings.max_pixels):
        yield image, None


def pdf_page_pixels(width_pt: float, height_pt: float, dpi: int) -> tuple[int, int]:
    """The size in pixels pypdfium2 renders a page of this size (in points) at `dpi`."""
    scale = dpi / 72
    return math.ceil(width_pt * scale), math.ceil(height_pt * scale)


def _check_bytes(data: bytes, settings: Settings) -> None:
    if not data:
        raise InputRejected("empty_file", "the input has zero bytes")
    if len(data) > settings.max_input_bytes:
        raise InputRejected(
            "too_large",
            f"the input is {len(data)} bytes, over the limit of {settings.max_input_bytes} "
            "(max_input_bytes)",
        )


def _check_page_count(page_count: int, settings: Settings) -> None:
    if page_count < 1:
        raise InputRejected("no_pages", "the document has no pages")
    if page_count > settings.max_pages:
        raise InputRejected(
            "too_many_pages",
            f"the document has {page_count} pages, over the limit of {settings.max_pages} "
            "(max_pages)",
        )


def _has_eof_marker(data: bytes) -> bool:
    """A complete PDF ends with %%EOF (trailing whitespace and NUL padding allowed).

    PDFium repairs some cut files (linearized ones, or a lost tail) and then renders the
    lost pages blank or not at all; a missing marker rejects those instead of OCRing half."""
    tail = data.rstrip(b"\x00\t\n\r\x0c ")[-_EOF_WINDOW:]
    return b"%%EOF" in tail


def _open_pdf(data: bytes) -> pdfium.PdfDocument:
    """Open with PDFium, or say why not: truncated, encrypted, empty or corrupt.

    Loads through the raw API because PDFium's last-error code is only fresh when the load
    returns no document; a document with no pages loads fine and must be told apart here.
    The caller holds the lock and keeps `data` alive until the document is closed."""
    if not _has_eof_marker(data):
        raise InputRejected(
            "truncated_pdf",
            f"no %%EOF marker in the last {_EOF_WINDOW} bytes: the file was cut short "
            f"({len(data)} bytes)",
        )
    raw = pdfium_c.FPDF_LoadMemDocument64(data, len(data), None)
    if not raw:
        code = pdfium_c.FPDF_GetLastError()
        if code in (pdfium_c.FPDF_ERR_PASSWORD, pdfium_c.FPDF_ERR_SECURITY):
            raise InputRejected(
                "encrypted_pdf",
                "the PDF is encrypted with a user password or an unsupported security handler",
            )
        name = _PDFIUM_ERRORS.get(code, f"error {code}")
        raise InputRejected("corrupt_pdf", f"PDFium cannot load the PDF: {name}")
    pdf = pdfium.PdfDocument(raw)
    if len(pdf) < 1:
        pdf.close()
        raise InputRejected("no_pages", "the PDF has no pages")
    return pdf


def _page_pixels(pdf: pdfium.PdfDocument, index: int, settings: Settings) -> tuple[int, int]:
    """A page's rendered size from its box alone (no page load), checked against the limit."""
    try:
        width_pt, height_pt = pdf.get_page_size(index)
    except pdfium.PdfiumError as exc:
        raise InputRejected(
            "corrupt_pdf", f"page {index + 1} has no readable size: {exc}"
        ) from None
    width, height = pdf_page_pixels(width_pt, height_pt, settings.dpi)
    if width < 1 or height < 1:
        raise InputRejected(
            "corrupt_pdf", f"page {index + 1} is {width_pt}x{height_pt} pt: an empty page box"
        )
    check_pixels(width, height, settings.max_pixels, f"page {index + 1} at {settings.dpi} dpi")
    return width, height


def _probe_pdf(data: bytes, settings: Settings) -> int:
    with _PDFIUM_LOCK:
        pdf = _open_pdf(data)
        try:
            page_count = len(pdf)
            _check_page_count(page_count, settings)
            for index in range(page_count):
                _page_pixels(pdf, index, settings)
        finally:
            pdf.close()
    return page_count


def _render_pdf(
    data: bytes, settings: Settings, text: bool
) -> Iterator[tuple[Image.Image, ir.TextLayer | None]]:
    """Render page by page, with the text layer when `text`; the document closes when the
    generator ends or is dropped."""
    with _PDFIUM_LOCK:
        pdf = _open_pdf(data)
    try:
        with _PDFIUM_LOCK:
            page_count = len(pdf)
            _check_page_count(page_count, settings)
            pdf.init_forms()  # filled-in form fields are page text too
        for index in range(page_count):
            with _PDFIUM_LOCK:
                _page_pixels(pdf, index, settings)
                image = _render_page(pdf, index, settings.dpi)
                layer = _text_layer(pdf, index, image) if text else None
            yield image, layer
    finally:
        with _PDFIUM_LOCK:
            pdf.close()


def _text_layer(pdf: pdfium.PdfDocument, index: int, image: Image.Image) -> ir.TextLayer | None:
    page = pdf[index]
    try:
        return textlayer.extract(page, image.width, image.height)
    except pdfium.PdfiumError as exc:
        raise InputRejected("corrupt_pdf", f"page {index + 1}: no readable text: {exc}") from None
    finally:
        page.close()


def _render_page(pdf: pdfium.PdfDocument, index: int, dpi: int) -> Image.Image:
    page = None
    bitmap = None
    try:
        page = pdf[index]
        bitmap = page.render(scale=dpi / 72, rev_byteorder=True)
        image = bitmap.to_pil().convert("RGB")  # a copy: independent of the bitmap's buffer
    except pdfium.PdfiumError as exc:
        raise InputRejected("corrupt_pdf", f"page {index + 1} cannot be rendered: {exc}") from None
    finally:
        if bitmap is not None:
            bitmap.close()
        if page is not None:
            page.close()
    return image
