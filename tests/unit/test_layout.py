"""Layout regions on real pages: categories, tables, figures, reading order by block."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines import load_detector, load_recognisers
from ocrfleet.engines.layout import (
    Block,
    LayoutDetector,
    build_regions,
    resolve_overlaps,
    split_at_gutters,
    trim_overreach,
)
from ocrfleet.pipeline.recognise import READ_AS_LINES, recognise
from ocrfleet.pipeline.regions import detect_regions
from ocrfleet.pipeline.review import decide
from ocrfleet.pipeline.split import iter_pages
from tests.conftest import REALDOCS
from tests.unit.synthetic import draw_page

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
        line(600, 500, 700, 530),  # text inside the figure: read after it, as text
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
        ("text", 4, 500, 600),
        ("table", 5, 760, 0),
        ("text", 6, 950, 480),
    ]
    assert [r.number for r in regions] == list(range(1, 11))
    assert regions[6].lines == []
    # A table's lines read row by row: both cells of the first row before the second row.
    assert [(b.y0, b.x0) for b in regions[8].lines] == [(770, 10), (770, 600), (820, 10)]


def test_columns_around_a_photo_read_down_the_left_column_first():
    # UNLV 8087's layout: two wide blocks on top, narrow columns either side of a photo
    # below them (no clean vertical cut: the photo spans the gutter), then wide blocks again.
    T = ir.Category.text
    blocks = {
        "top left": Block(T, box(270, 590, 1245, 980), 0.9),
        "top right": Block(T, box(1300, 600, 2275, 985), 0.9),
        "narrow left": Block(T, box(273, 985, 805, 2370), 0.9),
        "photo": Block(ir.Category.figure, box(855, 1010, 1690, 2290), 0.9),
        "narrow right": Block(T, box(1740, 990, 2275, 2325), 0.9),
        "bottom left": Block(T, box(271, 2400, 1245, 3145), 0.9),
        "bottom right": Block(T, box(1300, 2400, 2275, 3145), 0.9),
    }
    lines = [
        line(b.bbox.x0 + 5, y, b.bbox.x1 - 5, y + 40)
        for name, b in blocks.items()
        if name != "photo"
        for y in (b.bbox.y0 + 5, b.bbox.y1 - 45)
    ]
    regions = build_regions(list(blocks.values()), lines)
    by_block: dict[int, str] = {}
    for r in regions:
        for name, b in blocks.items():
            inside = b.bbox.x0 <= r.bbox.x0 and r.bbox.x1 <= b.bbox.x1
            if inside and b.bbox.y0 <= r.bbox.y0 < b.bbox.y1:
                by_block.setdefault(r.block, name)
    assert [by_block[n] for n in sorted(by_block)] == [
        "top left",
        "narrow left",
        "bottom left",
        "top right",
        "photo",
        "narrow right",
        "bottom right",
    ]


def test_a_block_nested_in_a_block_of_its_class_is_one_block():
    letter = Block(ir.Category.text, box(206, 205, 1366, 1014), 0.63)
    address = Block(ir.Category.text, box(206, 478, 664, 608), 0.69)  # scored higher
    table = Block(ir.Category.table, box(300, 700, 900, 900), 0.8)
    kept = resolve_overlaps([letter, address, table])
    assert sorted((b.category.value, b.bbox.as_tuple()) for b in kept) == [
        ("table", (300, 700, 900, 900)),
        ("text", (206, 205, 1366, 1014)),
    ]


def test_a_line_drawn_across_a_gutter_is_cut_in_the_blank_between_the_columns():
    # Two columns whose lines stand level, as one detector box each (the detector's merge);
    # word gaps are 13 px, the gutter 60 px, the boxes 40 px high.
    page, drawn = draw_page(
        (900, 200),
        [(20, 20, "left column words"), (370, 20, "right side text"), (20, 100, "a b")],
        font_size=28,
    )
    left = Block(ir.Category.text, box(15, 15, 320, 140), 0.9)
    right = Block(ir.Category.text, box(365, 15, 700, 80), 0.9)
    across = line(10, 14, 640, 54)
    short = line(10, 94, 90, 134)  # in one block only
    cut = split_at_gutters(page, [left, right], [across, short])
    assert [r.bbox.as_tuple() for r in cut[:2]] == [
        (10, 14, cut[0].bbox.x1, 54),
        (cut[0].bbox.x1, 14, 640, 54),
    ]
    assert drawn[0].bbox.x1 < cut[0].bbox.x1 < drawn[1].bbox.x0
    assert cut[2] == short
    # Stacked blocks, one block, or a figure beside the text: nothing to cut.
    below = Block(ir.Category.text, box(15, 60, 700, 140), 0.9)
    figure = Block(ir.Category.figure, box(365, 15, 700, 80), 0.9)
    for blocks in ([left], [left, below], [left, figure]):
        assert split_at_gutters(page, blocks, [across]) == [across]
    # A narrow middle column whose word sits near one edge: both gaps find the same blank
    # run, and the line is cut there once (no piece of no width).
    three, _ = draw_page(
        (900, 120), [(20, 20, "left words"), (318, 20, "b"), (560, 20, "right side")], 28
    )
    middle = Block(ir.Category.text, box(300, 15, 360, 60), 0.9)
    far = Block(ir.Category.text, box(540, 15, 760, 60), 0.9)
    pieces = split_at_gutters(three, [left, middle, far], [line(10, 14, 740, 54)])
    assert len(pieces) == 2 and all(p.bbox.width > 0 for p in pieces)
    # No blank run half the line's height wide near the gap (word gaps): kept whole.
    tight, _ = draw_page((900, 200), [(20, 20, "left column words right side text")], font_size=28)
    assert split_at_gutters(tight, [left, right], [across]) == [across]


def test_a_line_reaching_over_the_end_of_the_next_column_line_is_cut_back_at_the_gutter():
    # The right column's line box starts 20 px inside the left column (under half its
    # height), over the end of the left line ("words"): that end would be read twice.
    page, drawn = draw_page(
        (900, 200), [(20, 20, "left column words"), (370, 20, "right side text")], font_size=28
    )
    end = drawn[0].bbox.x1
    left = Block(ir.Category.text, box(15, 15, end + 5, 140), 0.9)
    right = Block(ir.Category.text, box(365, 15, 700, 80), 0.9)
    left_line, right_line = line(10, 14, end + 3, 54), line(end - 15, 14, 640, 54)
    trimmed = trim_overreach(page, [left, right], [left_line, right_line])
    assert trimmed[0] == left_line
    assert drawn[0].bbox.x1 < trimmed[1].bbox.x0 < drawn[1].bbox.x0
    assert (trimmed[1].bbox.x1, trimmed[1].bbox.y0, trimmed[1].bbox.y1) == (640, 14, 54)
    # Nobody else reads that end (no line of the row covers it), or the blocks are
    # stacked: kept as drawn.
    assert trim_overreach(page, [left, right], [right_line]) == [right_line]
    below = Block(ir.Category.text, box(15, 60, 700, 140), 0.9)
    assert trim_overreach(page, [left, below], [left_line, right_line])[1] == right_line


@pytest.fixture(scope="module")
def layout() -> LayoutDetector:
    detector = load_detector(Settings(layout="rapid"))
    assert isinstance(detector, LayoutDetector)
    return detector


def page_of(name: str):
    path = next(OLMOCR.rglob(name), OLMOCR / name)
    if not path.is_file():
        pytest.skip(f"no real documents under {REALDOCS} (set OCRFLEET_REALDOCS)")
    return next(iter_pages(path.read_bytes(), Settings()))


def test_the_layout_model_input_is_rapid_layouts_bit_for_bit(layout):
    """The normalisation through a table gives the float32 input rapid-layout's own
    preprocessing gives, on a real page."""
    from rapid_layout.model_handler.pp.pre_process import PPPreProcess

    handler = layout._model.model_handler.model_processors
    page = np.asarray(page_of("olmo2-pg4.pdf").convert("RGB"))[:, :, ::-1]
    ours = handler.pp_preprocess(np.ascontiguousarray(page))
    theirs = PPPreProcess(handler.img_size)(np.ascontiguousarray(page))
    assert ours.dtype == theirs.dtype == np.float32 and ours.shape == theirs.shape
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


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


SROIE = REALDOCS.parent / "train" / "sroie" / "images"


@pytest.mark.parametrize("text_height", [0, 28])
def test_unlv_lines_drawn_across_two_columns_are_read_in_their_columns(text_height):
    # UNLV 8071: four columns; the line detector draws six lines across a gutter (boxes
    # 1,240-1,310 px wide, each column about 690 px), which were read as one line of two
    # columns' text ("wandered around the house ply,he talked with her of"). So it does at
    # its own scale (text_height 0) and at the scale its survey picks (28, the default).
    path = REALDOCS / "tesseract_test" / "8071_093.3B.tif"
    if not path.is_file():
        pytest.skip(f"no real documents under {REALDOCS}")
    layout = load_detector(Settings(layout="rapid", det_text_height=text_height))
    assert isinstance(layout, LayoutDetector)
    page = next(iter_pages(path.read_bytes(), Settings()))
    columns = sorted(
        (b.bbox for b in layout.blocks(page) if b.bbox.y0 < 300),  # the columns' tops
        key=lambda b: b.x0,
    )
    assert len(columns) >= 4
    gutters = [(a.x1, b.x0) for a, b in pairwise(columns)]

    def crossing(regions: list[ir.Region]) -> list[tuple[int, int, int, int]]:
        return [
            r.bbox.as_tuple()
            for r in regions
            if r.category == ir.Category.text
            and r.bbox.height < 100
            and any(r.bbox.x0 < lo - 50 and r.bbox.x1 > hi + 50 for lo, hi in gutters)
        ]

    regions, lines = layout.detect(page), layout.lines.detect(page)
    assert crossing(regions) == []
    # each line drawn across a gutter is cut (at the detector's own scale three of the int8
    # detector's, six of fp32's; one at the survey's)
    assert len(crossing(lines)) >= (2 if text_height == 0 else 1)
    assert len(regions) >= len(lines) + len(crossing(lines))


@pytest.mark.parametrize(
    "name",
    [
        # 37 of the page's 40 text lines lie under one figure block (0.43 of the page, its
        # lines cover 0.22 of it: under FIGURE_TEXT_SHARE); before, it read as 3 lines.
        "fff590bed29a2854ac1f874dad5752ede1aa_pg1.pdf",
        # a whole receipt detected as one figure (0.44 of the photo): before, no text at all
        "sroie/044.jpg",
    ],
)
def test_every_line_the_detector_finds_is_a_region_even_under_a_figure(layout, name):
    if name.startswith("sroie/"):
        path = SROIE / name.split("/")[1]
        if not path.is_file():
            pytest.skip(f"no SROIE receipts under {SROIE}")
        page = next(iter_pages(path.read_bytes(), Settings()))
    else:
        page = page_of(name)
    lines = {line.bbox.as_tuple() for line in layout.lines.detect(page)}
    regions = layout.detect(page)
    figures = [r for r in regions if r.category == ir.Category.figure]
    assert figures and all(r.lines == [] for r in figures)
    read = {r.bbox.as_tuple() for r in regions if r.category.has_text and not r.lines}
    read |= {b.as_tuple() for r in regions for b in r.lines}
    assert len(lines) >= 30
    assert lines <= read
    # the figure's lines follow it, in its block
    first = regions.index(figures[0])
    after = [r for r in regions[first + 1 :] if r.block == figures[0].block]
    assert len(after) >= 30 and {r.category for r in after} == {ir.Category.text}
