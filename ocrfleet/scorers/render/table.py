"""Tables given as HTML `<table>`: parsed with html.parser, drawn as a grid of cells."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image, ImageDraw

from ocrfleet.scorers.render.bounds import Box
from ocrfleet.scorers.render.errors import RenderError
from ocrfleet.scorers.render.fonts import load_font
from ocrfleet.scorers.render.text import draw_block, largest_fitting, measure, wrap

# Tags that only group rows or style text: their content is kept, the tag itself ignored.
_TRANSPARENT = {
    "thead",
    "tbody",
    "tfoot",
    "colgroup",
    "col",
    "b",
    "strong",
    "i",
    "em",
    "u",
    "sup",
    "sub",
    "span",
    "font",
    "p",
    "div",
    "small",
    "big",
    "s",
    "strike",
    "code",
}
# Wrappers an engine may put around the table; harmless outside it.
_WRAPPERS = {"html", "body", "div", "p", "span", "center"}
MAX_SPAN = 1000
# Cell padding in em.
PADDING = 0.3


@dataclass
class Cell:
    rowspan: int = 1
    colspan: int = 1
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        lines = "".join(self.parts).split("\n")
        return "\n".join(" ".join(line.split()) for line in lines).strip("\n")


class _TableParser(HTMLParser):
    """Collects rows of cells from exactly one table, and refuses anything else."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[Cell]] = []
        self.state = "before"  # before -> inside -> after
        self.row: list[Cell] | None = None
        self.cell: Cell | None = None

    def _close_cell(self) -> None:
        if self.cell is not None:
            assert self.row is not None
            self.row.append(self.cell)
            self.cell = None

    def _close_row(self) -> None:
        self._close_cell()
        if self.row is not None:
            self.rows.append(self.row)
            self.row = None

    @staticmethod
    def _span(attrs: list[tuple[str, str | None]], name: str) -> int:
        value = dict(attrs).get(name)
        if value is None or value.strip() == "":
            return 1
        try:
            span = int(value.strip())
        except ValueError:
            raise RenderError(f"table: {name}={value!r} is not an integer") from None
        if not 1 <= span <= MAX_SPAN:
            raise RenderError(f"table: {name}={span} outside 1..{MAX_SPAN}")
        return span

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.state != "inside" and tag in _WRAPPERS:
            return
        if tag == "table":
            if self.state != "before":
                raise RenderError("table: nested or repeated <table> is not supported")
            self.state = "inside"
        elif self.state != "inside":
            raise RenderError(f"table: <{tag}> outside <table>")
        elif tag == "tr":
            self._close_row()
            self.row = []
        elif tag in ("td", "th"):
            if self.row is None:
                raise RenderError(f"table: <{tag}> outside <tr>")
            self._close_cell()
            self.cell = Cell(self._span(attrs, "rowspan"), self._span(attrs, "colspan"))
        elif tag == "br":
            if self.cell is not None:
                self.cell.parts.append("\n")
        elif tag not in _TRANSPARENT and tag != "caption":
            raise RenderError(f"table: unsupported tag <{tag}>")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("br", "col"):
            self.handle_starttag(tag, attrs)
        else:
            raise RenderError(f"table: self-closing <{tag}/> is not supported")

    def handle_endtag(self, tag: str) -> None:
        if self.state != "inside" and tag in _WRAPPERS:
            return
        if self.state != "inside":
            raise RenderError(f"table: </{tag}> outside <table>")
        if tag in ("td", "th"):
            if self.cell is None:
                raise RenderError(f"table: </{tag}> without an open cell")
            self._close_cell()
        elif tag == "tr":
            if self.row is None:
                raise RenderError("table: </tr> without an open row")
            self._close_row()
        elif tag == "table":
            self._close_row()
            self.state = "after"

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.parts.append(data)
        elif data.strip() and self.state != "inside":
            raise RenderError(f"table: text outside <table>: {data.strip()[:40]!r}")
        # Text between cells (a caption, stray words) is dropped: it has no cell to live in.

    def result(self) -> list[list[Cell]]:
        self.close()
        if self.state == "before":
            raise RenderError("table: no <table> element")
        if self.state == "inside":
            raise RenderError("table: <table> is never closed")
        if not any(self.rows):
            raise RenderError("table: no cells")
        return self.rows


@dataclass(frozen=True)
class Placed:
    row: int
    col: int
    rowspan: int
    colspan: int
    text: str


def parse_table(html: str) -> tuple[list[Placed], int, int]:
    """Cells placed on the grid (rowspan/colspan honoured), with the grid's rows and columns."""
    rows = _TableParser()
    rows.feed(html)
    parsed = rows.result()
    n_rows = len(parsed)
    taken: set[tuple[int, int]] = set()
    placed: list[Placed] = []
    for r, row in enumerate(parsed):
        c = 0
        for cell in row:
            while (r, c) in taken:
                c += 1
            rowspan = min(cell.rowspan, n_rows - r)
            for dr in range(rowspan):
                for dc in range(cell.colspan):
                    taken.add((r + dr, c + dc))
            placed.append(Placed(r, c, rowspan, cell.colspan, cell.text))
            c += cell.colspan
    n_cols = max(c for _, c in taken) + 1
    return placed, n_rows, n_cols


def _tracks(count: int, needs: list[tuple[int, int, int]], minimum: int) -> list[int]:
    """Sizes of `count` tracks so every (start, span, need) fits; single spans first."""
    sizes = [minimum] * count
    for start, span, need in sorted(needs, key=lambda item: item[1]):
        have = sum(sizes[start : start + span])
        if have < need:
            extra, rest = divmod(need - have, span)
            for offset in range(span):
                sizes[start + offset] += extra + (1 if offset < rest else 0)
    return sizes


def _stretch(sizes: list[int], total: int) -> list[int]:
    """Edges (len+1) of tracks scaled to exactly `total` pixels."""
    whole = sum(sizes)
    edges, running = [0], 0
    for size in sizes:
        running += size
        edges.append(running * total // whole)
    return edges


def render_table(html: str, canvas: Image.Image, box: Box, font_path: Path) -> None:
    cells, n_rows, n_cols = parse_table(html)
    x0, y0, x1, y1 = box
    width, height = x1 - x0, y1 - y0

    def layout(size: int):
        font = load_font(font_path, size)
        pad = max(1, round(size * PADDING))
        blocks = [measure(wrap(cell.text, font, None), font, size) for cell in cells]
        line = max(1, round(size * 1.2))
        cols = _tracks(
            n_cols,
            [(c.col, c.colspan, b.width + 2 * pad) for c, b in zip(cells, blocks, strict=True)],
            2 * pad,
        )
        rows = _tracks(
            n_rows,
            [
                (c.row, c.rowspan, max(b.height, line) + 2 * pad)
                for c, b in zip(cells, blocks, strict=True)
            ],
            2 * pad,
        )
        return font, blocks, cols, rows

    def fits(size: int) -> bool:
        _, _, cols, rows = layout(size)
        return sum(cols) <= width and sum(rows) <= height

    size = largest_fitting(fits, height)
    font, blocks, cols, rows = layout(size)
    xs = [x0 + edge for edge in _stretch(cols, width)]
    ys = [y0 + edge for edge in _stretch(rows, height)]
    pad = max(1, round(size * PADDING))
    draw = ImageDraw.Draw(canvas)
    for cell, block in zip(cells, blocks, strict=True):
        left, right = xs[cell.col], xs[cell.col + cell.colspan]
        top, bottom = ys[cell.row], ys[cell.row + cell.rowspan]
        draw.rectangle((left, top, right - 1, bottom - 1), outline=0, width=1)
        if block.width:
            draw_block(draw, block, font, left + pad, top + (bottom - top - block.height) // 2)
