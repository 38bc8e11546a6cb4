"""Markdown: title regions as headings, tables as Markdown tables (HTML tables as they
are), formulas as `$$…$$` display math, other text as paragraphs; pages separated by a
horizontal rule."""

from __future__ import annotations

import re

from ocrfleet.formats.document import DocumentView, RegionView

MEDIA_TYPE = "text/markdown; charset=utf-8"

_CELL_SPLIT = re.compile(r"\t+|\s{2,}|\s*\|\s*")


def table(text: str) -> str:
    """A table region's text as a table: HTML passes through, otherwise one row a line,
    cells split on tabs, runs of spaces or pipes; the first row is the header."""
    if text.lstrip().lower().startswith("<table"):
        return text.strip()
    rows = [
        [cell.strip() for cell in _CELL_SPLIT.split(line.strip().strip("|")) if cell.strip()]
        for line in text.splitlines()
        if line.strip() and not set(line.strip()) <= set("|-: ")
    ]
    rows = [row for row in rows if row]
    if not rows:
        return ""
    width = max(len(row) for row in rows)
    rows = [row + [""] * (width - len(row)) for row in rows]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(rows[0]), line(["---"] * width), *(line(r) for r in rows[1:])])


def block(region: RegionView) -> str:
    text = region.text.strip()
    if not text:
        return ""
    category = region.category
    if category == "title":
        return "## " + " ".join(text.split())
    if category == "table":
        return table(text)
    if category == "formula":
        return f"$$\n{text}\n$$"
    return text


def render(doc: DocumentView) -> str:
    pages = []
    for page in doc.pages:
        blocks = [b for b in (block(r) for r in page.regions) if b]
        if blocks:
            pages.append("\n\n".join(blocks))
    return "\n\n---\n\n".join(pages) + "\n"
