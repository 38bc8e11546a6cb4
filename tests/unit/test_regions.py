"""Region stage: box geometry, reading order, the one crop, and detection on drawn pages."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from ocrfleet import ir
from ocrfleet.engines.rapidocr import RapidDetector
from ocrfleet.pipeline.regions import (
    clip_bbox,
    crop,
    detect_regions,
    order_regions,
    polygon_bbox,
    reading_order,
)
from tests.unit.synthetic import draw_page, match


def box(x0: int, y0: int, x1: int, y1: int) -> ir.BBox:
    return ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1)


@pytest.fixture(scope="module")
def detector() -> RapidDetector:
    return RapidDetector()


# --- geometry -------------------------------------------------------------------------


def test_polygon_bbox_is_the_clipped_axis_aligned_hull():
    tilted = [(10.4, 20.6), (110.2, 18.1), (111.9, 40.0), (9.5, 42.3)]
    assert polygon_bbox(tilted, 200, 100) == box(9, 18, 112, 43)
    assert polygon_bbox([(-5, -5), (50, -5), (50, 30), (-5, 30)], 40, 20) == box(0, 0, 40, 20)


def test_polygon_bbox_outside_the_page_or_flat_is_none():
    assert polygon_bbox([(120, 10), (150, 10), (150, 20), (120, 20)], 100, 100) is None
    assert polygon_bbox([(10, 10), (50, 10), (50, 10), (10, 10)], 100, 100) is None
    assert clip_bbox(box(0, 0, 10, 10), 100, 100) == box(0, 0, 10, 10)
    assert clip_bbox(box(90, 90, 150, 150), 100, 100) == box(90, 90, 100, 100)


# --- reading order on given boxes -------------------------------------------------------


def test_single_column_reads_top_to_bottom_whatever_the_input_order():
    lines = [box(50, 30 + 40 * i, 600, 62 + 40 * i) for i in range(6)]
    shuffled = [lines[i] for i in (3, 0, 5, 1, 4, 2)]
    assert [shuffled[i] for i in reading_order(shuffled)] == lines


def test_boxes_of_one_line_read_left_to_right_despite_vertical_jitter():
    # one text line split by the detector into three boxes, slightly offset vertically
    words = [box(400, 104, 560, 136), box(40, 100, 200, 132), box(220, 98, 380, 131)]
    below = box(40, 150, 560, 182)
    order = reading_order([*words, below])
    assert order == [1, 2, 0, 3]


def test_title_two_columns_and_footer():
    title = box(100, 20, 900, 70)
    left = [box(40, 100 + 40 * i, 470, 132 + 40 * i) for i in range(8)]
    right = [box(530, 100 + 40 * i, 960, 132 + 40 * i) for i in range(8)]
    footer = box(40, 460, 960, 492)
    boxes = [footer, *right, title, *left]
    expected = [title, *left, *right, footer]
    assert [boxes[i] for i in reading_order(boxes)] == expected


def test_a_full_width_heading_between_two_column_sections_separates_them():
    def section(top: int) -> tuple[list[ir.BBox], list[ir.BBox]]:
        left = [box(40, top + 40 * i, 470, top + 32 + 40 * i) for i in range(6)]
        right = [box(530, top + 40 * i, 960, top + 32 + 40 * i) for i in range(6)]
        return left, right

    a_left, a_right = section(20)
    heading = box(40, 280, 900, 320)
    b_left, b_right = section(340)
    boxes = [*b_right, heading, *a_right, *b_left, *a_left]
    expected = [*a_left, *a_right, heading, *b_left, *b_right]
    assert [boxes[i] for i in reading_order(boxes)] == expected


def test_a_caption_set_into_the_gutter_does_not_interleave_the_columns():
    left, right, caption = [], [], []
    for i in range(20):
        top = 40 + 40 * i
        if 8 <= i < 11:  # the columns narrow around a caption that crosses the gutter
            left.append(box(40, top, 380, top + 32))
            right.append(box(640, top, 960, top + 32))
            caption.append(box(410, top, 610, top + 32))
        else:
            left.append(box(40, top, 470, top + 32))
            right.append(box(530, top, 960, top + 32))
    boxes = [*right, *caption, *left]
    ordered = [boxes[i] for i in reading_order(boxes)]
    text_order = [b for b in ordered if b not in caption]
    assert text_order == [*left, *right]


def test_padded_boxes_that_overlap_across_a_narrow_gutter_still_split_into_columns():
    # Detector boxes are padded ~0.3 height: neighbouring lines overlap vertically and the
    # boxes of the two columns touch, although the ink has a 24 px gutter between them.
    left = [box(40, 100 + 40 * i, 492, 150 + 40 * i) for i in range(10)]
    right = [box(492, 100 + 40 * i, 944, 150 + 40 * i) for i in range(10)]
    boxes = [b for pair in zip(left, right, strict=True) for b in pair]
    assert [boxes[i] for i in reading_order(boxes)] == [*left, *right]


def test_one_line_merged_across_the_gutter_does_not_hide_the_columns():
    merged = box(40, 100, 944, 140)  # a detector joined the first lines of both columns
    left = [box(40, 140 + 40 * i, 470, 172 + 40 * i) for i in range(12)]
    right = [box(516, 140 + 40 * i, 944, 172 + 40 * i) for i in range(12)]
    boxes = [b for pair in zip(left, right, strict=True) for b in pair] + [merged]
    assert [boxes[i] for i in reading_order(boxes)] == [merged, *left, *right]


def test_order_regions_renumbers_from_one_and_keeps_the_rest():
    regions = [
        ir.Region(number=7, bbox=box(10, 200, 300, 230), det_score=0.5),
        ir.Region(number=3, bbox=box(10, 10, 300, 40), det_score=0.9),
    ]
    ordered = order_regions(regions)
    assert [r.number for r in ordered] == [1, 2]
    assert [r.det_score for r in ordered] == [0.9, 0.5]
    assert reading_order([]) == []


# --- crop ---------------------------------------------------------------------------------


def test_crop_is_exactly_the_box_pixels():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(60, 80, 3), dtype=np.uint8)
    page = Image.fromarray(pixels, "RGB")
    piece = crop(page, box(5, 7, 25, 19))
    assert piece.size == (20, 12)
    assert np.array_equal(np.asarray(piece), pixels[7:19, 5:25])


def test_crop_outside_the_page_is_an_error_not_padding():
    page = Image.new("RGB", (80, 60), "white")
    with pytest.raises(ValueError, match="outside"):
        crop(page, box(70, 10, 90, 20))
    assert crop(page, box(10, 10, 10, 20)).size == (0, 10)


# --- detection on drawn pages (real RapidOCR detector) --------------------------------------


def test_detects_each_line_of_a_column_in_order(detector):
    texts = [
        "The quick brown fox jumps over the lazy dog",
        "Pack my box with five dozen liquor jugs",
        "How vexingly quick daft zebras jump",
        "Sphinx of black quartz, judge my vow",
    ]
    page, lines = draw_page((1000, 400), [(40, 40 + 80 * i, t) for i, t in enumerate(texts)])
    regions = detect_regions(page, detector)
    assert [r.number for r in regions] == list(range(1, len(regions) + 1))
    assert len(regions) == len(texts)
    assert match(lines, regions) == [1, 2, 3, 4]
    for line, region in zip(lines, regions, strict=True):
        # the region holds the whole line of ink, with at most a modest margin
        assert region.bbox.x0 <= line.bbox.x0 and region.bbox.x1 >= line.bbox.x1
        assert region.bbox.y0 <= line.bbox.y0 and region.bbox.y1 >= line.bbox.y1
        assert region.bbox.height < 2.5 * line.bbox.height
        assert region.category == ir.Category.text
        assert 0.0 < region.det_score <= 1.0


def test_two_columns_under_a_title_read_column_by_column(detector):
    left = ["Left column starts", "with this text and", "runs down the page", "to the very end."]
    right = ["Right column then", "follows after all", "of the left one is", "completely read."]
    spec = [(250, 30, "A Title Across Both")]
    spec += [(40, 140 + 60 * i, t) for i, t in enumerate(left)]
    spec += [(560, 140 + 60 * i, t) for i, t in enumerate(right)]
    page, lines = draw_page((1000, 420), spec)
    regions = detect_regions(page, detector)
    assert len(regions) == 9
    assert match(lines, regions) == list(range(1, 10))


def test_blank_page_has_no_regions(detector):
    assert detect_regions(Image.new("RGB", (400, 300), "white"), detector) == []


def test_detector_regions_lie_inside_the_page(detector):
    # text touching the page edges: boxes must be clipped, never reach outside
    page, _ = draw_page((420, 60), [(0, 0, "Edge to edge text line")], font_size=34)
    regions = detect_regions(page, detector)
    assert regions
    for region in regions:
        assert region.bbox.x1 <= page.width and region.bbox.y1 <= page.height
        assert crop(page, region.bbox).size == (region.bbox.width, region.bbox.height)
