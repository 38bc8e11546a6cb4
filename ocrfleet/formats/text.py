"""Plain text: region texts in reading order, one a line, pages in order (what the
`document_text` view gives)."""

from __future__ import annotations

from ocrfleet.formats.document import DocumentView

MEDIA_TYPE = "text/plain; charset=utf-8"


def render(doc: DocumentView) -> str:
    return "\n".join(page.text for page in doc.pages if page.regions)
