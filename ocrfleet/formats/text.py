"""Plain text: region texts in reading order, one a line, pages in order and separated by a
form feed (the `document_text` view gives the same lines without the page breaks)."""

from __future__ import annotations

from ocrfleet.formats.document import DocumentView

MEDIA_TYPE = "text/plain; charset=utf-8"


def render(doc: DocumentView) -> str:
    """Every page's text, pages separated by a form feed (as `pdftotext` does), so a page
    without text still counts; '' for a document without pages."""
    return "\f\n".join(page.text + "\n" for page in doc.pages)
