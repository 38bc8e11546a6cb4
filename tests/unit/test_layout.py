"""Layout regions on real pages: categories, tables, figures, reading order by block."""

from __future__ import annotations

import pytest

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines import load_detector, load_recognisers
from ocrfleet.engines.layout import Block, LayoutDetector, build_regions
from ocrfleet.pipeline.recognise import READ_AS_LINES, recognise
from ocrfleet.pipeline.regions import detect_regions
from ocrfleet.pipeline.review import decide
from ocrfleet.pipeline.split import iter_pages
from tests.conftest import REALDOCS

OLMOCR = REALDOCS / "olmocr_bench_sample" / "pdfs"


def box(x0: int, y0: int, x1: int, y1: int) -> ir.BBox:
    return ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1)


def line(x0: int, y0: int, x1: int, y1: int) -> ir.Region:
    return ir.Region(number=1, bbox=box(x0, y0, x1, y1))


def test_blocks_order_columns_and_keep_figures_and_loose_lines():
    # Two columns of text under a title, a figure in the right column, a table below both,
    # and a page number the layout model missed.
    blocks = [
        Block(ir.Category.text, box(520, 100, 1000, 400), 0.9),  # right column, top
        Block(ir.Category.title, box(0, 0, 1000, 60), 0.9),
        Block(ir.Category.text, box(0, 100, 480, 700), 0.9),  # left column
        Block(ir.Category.figure, box(520, 420, 1000, 700), 0.9),
        Block(ir.Category.table, box(0, 760, 1000, 900), 0.9),
    ]
    lines = [
        line(10, 10, 900, 50),
        *[line(5, y, 470, y + 30) for y in (110, 150, 190)],
        *[line(530, y, 990, y + 30) for y in (110, 150)],
        line(600, 500, 700, 530),  # text inside the figure: not read
        line(10, 770, 300, 800),
        line(600, 770, 990, 800),
        line(10, 820, 300, 850),
        line(480, 950, 520, 980),  # page number, no block
    ]
    regions = build_regions(blocks, lines)
    kinds = [(r.category.value, r.block, r.bbox.y0, r.bbox.x0) for r in regions]
    assert kinds == [
        ("title", 1, 10, 10),
        ("text", 2, 110, 5),
        ("text", 2, 150, 5),
        ("text", 2, 190, 5),
        ("text", 3, 110, 530),
        ("text", 3, 150, 530),
        ("figure", 4, 420, 520),
        ("table", 5, 760, 0),
        ("text", 6, 950, 480),
    ]
    assert [r.number for r in regions] == list(range(1, 10))
    assert regions[6].lines == []
    # A table's lines read row by row: both cells of the first row before the second row.
    assert [(b.y0, b.x0) for b in regions[7].lines] == [(770, 10), (770, 600), (820, 10)]


@pytest.fixture(scope="module")
def layout() -> LayoutDetector:
    detector = load_detector(Settings(layout="rapid"))
    assert isinstance(detector, LayoutDetector)
    return detector


def page_of(name: str):
    path = OLMOCR / name
    if not path.is_file():
        pytest.skip(f"no real documents under {REALDOCS} (set OCRFLEET_REALDOCS)")
    return next(iter_pages(path.read_bytes(), Settings()))


def test_a_real_table_is_a_table_region_read_by_lines_and_flagged(layout):
    page = page_of("olmo2-pg4.pdf")
    regions = layout.detect(page)
    # The page stage keeps the layout's block order (it re-sorts only plain text lines).
    assert detect_regions(page, layout) == regions
    tables = [r for r in regions if r.category == ir.Category.table]
    assert len(tables) >= 1
    table = tables[0]
    assert len(table.lines) >= 10
    assert {r.category for r in regions} >= {ir.Category.text, ir.Category.table}
    [rapid] = load_recognisers(Settings())
    candidates = recognise(page, [table], [rapid])
    [candidate] = candidates
    assert candidate.read_as == READ_AS_LINES
    assert candidate.text.count("\n") >= 9
    [decision] = decide([table], candidates, [], Settings())
    assert decision.flag_reason == "no_table_engine"
    assert decision.chosen_engine == "rapidocr"
