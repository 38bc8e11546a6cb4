"""Markdown: title regions as headings, tables as Markdown tables (HTML tables rebuilt from
their cells), formulas as `$$…$$` display math, other text as paragraphs; pages separated
by a horizontal rule.

OCR text is data, never markup: `&`, `<`, `>`, `[`, `]`, backticks and a backslash before
punctuation are written as character references, so no renderer (CommonMark,
python-markdown, markdown-it with HTML on) sees a tag, an entity, a link, an image, a code
span or an escape in it, and a browser shows the characters as read. References, not
backslash escapes: a backslash in the text would escape the escape."""

from __future__ import annotations

import re

from lxml import etree, html

from ocrfleet.formats.document import DocumentView, RegionView

MEDIA_TYPE = "text/markdown; charset=utf-8"

_CELL_SPLIT = re.compile(r"\t+|\s{2,}|\s*\|\s*")
_REFERENCES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;", "`": "&#96;"}
# A backslash before ASCII punctuation is a Markdown escape: as a reference it stays itself.
_MARKUP = re.compile(r"[&<>\[\]`]|\\(?=[!-/:-@\[-`{-~])")
# An HTML table keeps only its structure: these elements, these attributes (numbers only).
_TABLE_TAGS = frozenset({"table", "caption", "thead", "tbody", "tfoot", "tr", "th", "td"})
_SPANS = ("colspan", "rowspan")


def escape(text: str) -> str:
    """`text` with every character Markdown or HTML could read as markup as a reference."""
    return _MARKUP.sub(lambda m: _REFERENCES.get(m.group(), "&#92;"), text)


def html_table(text: str) -> str:
    """An HTML table region rebuilt from its table elements and escaped text: any other
    element (a script, an image, a link) is dropped and its text kept as text, attributes
    but row and column spans are dropped. One line, so no blank line ends the HTML block
    and hands its rest to the Markdown parser."""
    try:
        root = html.fragment_fromstring(text, create_parent="div")
    except (etree.ParserError, ValueError):
        root = None
    if root is None or root.find(".//table") is None:  # not a table after all: text
        return escape(" ".join(text.split()))
    out: list[str] = []

    def walk(element: etree._Element) -> None:
        tag = element.tag if isinstance(element.tag, str) else None  # comments, PIs: no tag
        kept = tag in _TABLE_TAGS
        if kept:
            spans = "".join(
                f' {name}="{element.get(name)}"'
                for name in _SPANS
                if (element.get(name) or "").isdigit() and len(element.get(name) or "") < 4
            )
            out.append(f"<{tag}{spans}>")
        if tag is not None and element.text:
            out.append(escape(element.text))
        for child in element:
            walk(child)
        if kept:
            out.append(f"</{tag}>")
        if element.tail:
            out.append(escape(element.tail))

    walk(root)
    return " ".join("".join(out).split())


def table(text: str) -> str:
    """A table region's text as a table: HTML is rebuilt (`html_table`), otherwise one row
    a line, cells split on tabs, runs of spaces or pipes; the first row is the header."""
    if text.lstrip().lower().startswith("<table"):
        return html_table(text.strip())
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
        return "| " + " | ".join(escape(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(rows[0]), line(["---"] * width), *(line(r) for r in rows[1:])])


def block(region: RegionView) -> str:
    text = region.text.strip()
    if not text:
        return ""
    category = region.category
    if category == "title":
        return "## " + escape(" ".join(text.split()))
    if category == "table":
        return table(text)
    if category == "formula":
        return f"$$\n{escape(text)}\n$$"
    return escape(text)


def render(doc: DocumentView) -> str:
    pages = []
    for page in doc.pages:
        blocks = [b for b in (block(r) for r in page.regions) if b]
        if blocks:
            pages.append("\n\n".join(blocks))
    return "\n\n---\n\n".join(pages) + "\n"
