"""Output formats of a document, all rendered from the same stored rows
(`formats.document.load_document`): `ocrfleet results`, the client and the HTTP API use
these and nothing else."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from ocrfleet.formats import alto, hocr, markdown, pdf, text
from ocrfleet.formats import json as json_format
from ocrfleet.formats.document import DocumentView, load_document
from ocrfleet.storage import ObjectStore

FORMATS: dict[str, str] = {
    "text": text.MEDIA_TYPE,
    "json": json_format.MEDIA_TYPE,
    "markdown": markdown.MEDIA_TYPE,
    "hocr": hocr.MEDIA_TYPE,
    "alto": alto.MEDIA_TYPE,
    "pdf": pdf.MEDIA_TYPE,
}
# The file name suffix of each format, for results written to files.
SUFFIXES: dict[str, str] = {
    "text": ".txt",
    "json": ".json",
    "markdown": ".md",
    "hocr": ".hocr",
    "alto": ".xml",
    "pdf": ".pdf",
}
_TEXT_RENDERERS: dict[str, Callable[[DocumentView], str]] = {
    "text": text.render,
    "json": json_format.render,
    "markdown": markdown.render,
    "hocr": hocr.render,
    "alto": alto.render,
}

__all__ = ["FORMATS", "SUFFIXES", "DocumentView", "load_document", "render", "render_document"]


def render(doc: DocumentView, fmt: str, store: ObjectStore | None = None) -> bytes:
    """`doc` in format `fmt`; the PDF reads its page images from `store`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt == "pdf":
        if store is None:
            raise ValueError("the pdf format needs the object store that holds the page images")
        return pdf.render(doc, lambda page: store.get(store.key_of(page.image_uri)))
    return _TEXT_RENDERERS[fmt](doc).encode("utf-8")


def render_document(
    session: Session, document_id: int, fmt: str, store: ObjectStore | None = None
) -> bytes:
    return render(load_document(session, document_id), fmt, store)
