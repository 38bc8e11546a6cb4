"""Detection on tiles: the window plan, the merge of boxes, and the real detector on pages
it could not take whole (a 59 Mpx page with one line, strips of extreme aspect ratio)."""

from __future__ import annotations

import itertools
import random

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrfleet import ir
from ocrfleet.engines.rapidocr import RapidDetector, RapidRecogniser
from ocrfleet.metrics import cer
from ocrfleet.pipeline import tiles
from ocrfleet.pipeline.regions import crop

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
LINE = "Quarterly revenue grew by seventeen percent"


def box(x0: int, y0: int, x1: int, y1: int) -> ir.BBox:
    return ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1)


def covers(bbox: ir.BBox, ink: tuple[int, int, int, int], slack: int = 6) -> bool:
    """`bbox` holds the ink's box, up to `slack` pixels on each side."""
    x0, y0, x1, y1 = ink
    return (
        bbox.x0 <= x0 + slack
        and bbox.y0 <= y0 + slack
        and bbox.x1 >= x1 - slack
        and bbox.y1 >= y1 - slack
    )


def test_pages_up_to_twice_the_input_size_are_detected_whole() -> None:
    plan, windows = tiles.plan(3300, 2550, max_side=2000, min_side=30, max_pixels=4_000_000)
    assert (plan.method, plan.windows) == ("whole", 1)
    assert plan.scale == pytest.approx(2000 / 3300)
    assert windows == [box(0, 0, 3300, 2550)]


@pytest.mark.parametrize("size", [(2560, 3300), (3300, 2550), (1224, 1584)])
def test_a_page_over_the_pixel_budget_is_read_in_full_width_bands(size: tuple[int, int]) -> None:
    width, height = size
    plan, windows = tiles.plan(width, height, 2000, 30, min_short=736)
    scale = min(1.0, 2000 / max(size))
    assert plan.method == "tiles" and plan.scale == pytest.approx(scale)
    assert plan.windows == len(windows) >= 3
    for window in windows:
        assert (window.x0, window.x1) == (0, width)  # no line is cut along its length
        assert window.width * window.height * scale**2 <= tiles.MAX_PIXELS * 1.01
        assert window.height * scale >= tiles.MIN_WINDOW
    assert (windows[0].y0, windows[-1].y1) == (0, height)
    for top, bottom in itertools.pairwise(windows):
        # Bands of one size share OVERLAP and no more: no band reads more of its neighbours.
        assert tiles.OVERLAP - 1 <= (top.y1 - bottom.y0) * scale <= tiles.OVERLAP + 2
    # The fewest bands: one fewer, at the largest size, would not cover the page.
    band = max(tiles.MIN_WINDOW, tiles.MAX_PIXELS / (width * scale))
    fewer = len(windows) - 1
    assert fewer * band - (fewer - 1) * tiles.OVERLAP < height * scale


def test_a_page_the_detector_takes_across_is_one_column_of_bands() -> None:
    """A width the scale maps back to itself only up to float error is not cut across."""
    plan, windows = tiles.plan(1000, 650, 2000, 30, min_short=736)
    assert plan.method == "tiles" and plan.scale == pytest.approx(736 / 650)
    assert [(w.x0, w.x1) for w in windows] == [(0, 1000), (0, 1000)]


def test_bands_keep_the_detectors_own_scaling_of_a_short_side() -> None:
    """rapidocr reads a page whose short side is under 736 px scaled up to 736: a narrow
    receipt's bands are cut at that scale, so they see the pixels a whole pass would."""
    plan, windows = tiles.plan(500, 1500, 2000, 30, min_short=736)
    assert plan.method == "tiles" and plan.scale == pytest.approx(736 / 500)
    assert all((w.x0, w.x1) == (0, 500) for w in windows)
    assert all(w.width * w.height * plan.scale**2 <= tiles.MAX_PIXELS * 1.01 for w in windows)
    # Under the budget after the scaling up: whole, and the detector scales it itself.
    plan, _ = tiles.plan(400, 400, 2000, 30, min_short=736)
    assert (plan.method, plan.scale) == ("whole", 1.0)
    # A page wider than the padding ratio is padded before the scaling up, as rapidocr does:
    # 2000x100 is padded to 2000x250 and read at 736 / 250.
    plan, windows = tiles.plan(2000, 100, 2000, 30, min_short=736, wide_ratio=8)
    assert plan.method == "tiles" and plan.scale == pytest.approx(736 / 250)
    assert len({w.x0 for w in windows}) > 1  # wider than the detector takes: cut across


@pytest.mark.parametrize("size", [(7700, 7700), (20000, 10), (10, 20000), (4001, 900)])
def test_tiles_cover_the_page_with_overlap(size: tuple[int, int]) -> None:
    width, height = size
    plan, windows = tiles.plan(width, height, max_side=2000, min_side=30)
    assert (plan.method, plan.scale, plan.windows) == ("tiles", tiles.MIN_SCALE, len(windows))
    covered = Image.new("1", size, 0)
    for window in windows:
        assert window.width <= 2000 / tiles.MIN_SCALE and window.height <= 2000 / tiles.MIN_SCALE
        covered.paste(1, window.as_tuple())
    assert covered.getbbox() == (0, 0, width, height)
    assert all(covered.getpixel((x, y)) for x in range(0, width, 97) for y in range(0, height, 97))
    xs = sorted({w.x0 for w in windows})
    ends = sorted({w.x1 for w in windows})
    for start, end in zip(xs[1:], ends, strict=False):
        assert end - start >= tiles.OVERLAP / tiles.MIN_SCALE


def test_padding_bounds_the_aspect_ratio() -> None:
    assert tiles.padding(2000, 5, min_side=30) == (0, 245)
    assert tiles.padding(5, 2000, min_side=30) == (245, 0)
    assert tiles.padding(800, 600, min_side=30) == (0, 0)


def test_merge_joins_a_line_cut_at_a_window_edge_and_duplicates_only() -> None:
    found = [
        (0, box(100, 100, 1050, 140), 0.9),  # a line cut at x=1050 by window 0 ...
        (1, box(990, 102, 1800, 141), 0.8),  # ... and its rest in window 1
        (0, box(100, 160, 900, 200), 0.7),  # the next line, seen by window 0 ...
        (1, box(850, 160, 1500, 200), 0.95),  # ... and window 1 (same line, other part)
        (1, box(102, 161, 898, 199), 0.6),  # a duplicate of window 0's box
        (0, box(100, 300, 500, 340), 0.9),  # two boxes of one window never merge ...
        (0, box(480, 300, 900, 340), 0.9),  # ... even when they touch
    ]
    merged = sorted((b.as_tuple(), s) for b, s in tiles.merge(found))
    assert merged == [
        ((100, 100, 1800, 141), 0.9),
        ((100, 160, 1500, 200), 0.95),
        ((100, 300, 500, 340), 0.9),
        ((480, 300, 900, 340), 0.9),
    ]


def test_neighbouring_columns_seen_by_two_bands_stay_apart() -> None:
    top, bottom = box(0, 0, 3000, 800), box(0, 600, 3000, 1400)
    found = [(0, box(100, 700, 1500, 740), 0.9), (1, box(1495, 702, 2900, 742), 0.9)]
    assert len(tiles.merge(found, [top, bottom])) == 2
    left, right = box(0, 0, 1600, 1400), box(1400, 0, 3000, 1400)  # side by side: one line
    assert len(tiles.merge(found, [left, right])) == 1


def test_two_columns_one_band_joined_are_kept_as_the_other_band_split_them() -> None:
    found = [
        (0, box(1740, 840, 3055, 907), 0.9),  # window 0 joined two columns ...
        (1, box(1742, 843, 2426, 900), 0.9),  # ... that window 1 saw apart
        (1, box(2403, 846, 3055, 907), 0.9),
        (0, box(100, 1000, 1400, 1040), 0.9),  # one line seen whole by both windows
        (1, box(102, 1001, 1398, 1041), 0.9),
    ]
    kept = [f[1].as_tuple() for f in tiles.finer(found)]
    assert kept == [
        (1742, 843, 2426, 900),
        (2403, 846, 3055, 907),
        (100, 1000, 1400, 1040),
        (102, 1001, 1398, 1041),
    ]


def test_finer_drops_what_a_pairwise_reading_of_its_rule_drops() -> None:
    """The rule over every pair at once drops the boxes one pair at a time would: random
    lines, half of them seen by another window as two pieces side by side."""
    rng = random.Random(3)

    def pairwise(found):
        dropped = set()
        for i, (wi, a, _) in enumerate(found):
            pieces: dict[int, list[ir.BBox]] = {}
            for wj, b, _ in found:
                if wj != wi and b.share_inside(a) >= tiles.SAME_TEXT and b.width < a.width:
                    pieces.setdefault(wj, []).append(b)
            for boxes in pieces.values():
                boxes.sort(key=lambda b: b.x0)
                if len(boxes) > 1 and all(
                    p.x1 <= q.x0 + tiles.OVERLAP_X for p, q in itertools.pairwise(boxes)
                ):
                    dropped.add(i)
        return [f for i, f in enumerate(found) if i not in dropped]

    dropped = 0
    for _ in range(60):
        found = []
        for _ in range(rng.randint(1, 40)):
            x0, y0, w, h = rng.randint(0, 900), rng.randint(0, 900), rng.randint(20, 300), 20
            found.append((rng.randint(0, 1), box(x0, y0, x0 + w, y0 + h), 0.9))
            if rng.random() < 0.5:
                cut = x0 + w // 2 + rng.randint(-5, 5)
                found.append((2, box(x0 + rng.randint(0, 4), y0, cut, y0 + h), 0.9))
                found.append((2, box(cut + rng.randint(-3, 8), y0 + 1, x0 + w + 9, y0 + h), 0.9))
        expected = pairwise(found)
        assert tiles.finer(found) == expected
        dropped += len(found) - len(expected)
    assert dropped > 50  # the rule was exercised, not only passed through


def test_stacked_lines_of_different_windows_stay_apart() -> None:
    found = [(0, box(100, 100, 900, 140), 0.9), (1, box(100, 128, 900, 168), 0.9)]
    assert len(tiles.merge(found)) == 2


def test_a_line_cut_at_a_seam_is_kept_from_the_band_that_sees_it_whole() -> None:
    top, bottom = box(0, 0, 1500, 800), box(0, 600, 1500, 1400)  # overlap 600..800, middle 700
    found = [
        (0, box(100, 770, 900, 800), 0.9),  # a sliver: window 0 cut the line at its bottom
        (1, box(100, 770, 900, 830), 0.9),  # the line, whole in window 1
        (1, box(100, 840, 900, 870), 0.9),  # the next line, which the sliver would glue to it
        (0, box(100, 640, 900, 680), 0.8),  # a line in window 0's share, whole in window 0
        (1, box(100, 600, 900, 680), 0.7),  # ... cut by window 1 at its top: dropped
        (0, box(100, 500, 900, 800), 0.6),  # a tall box cut by window 0, centre in its share
        (1, box(100, 600, 900, 1000), 0.6),  # ... and by window 1, centre in its share
    ]
    kept = tiles.seam_slivers(found, [top, bottom], margin=4)
    assert [f[1].as_tuple() for f in kept] == [
        (100, 770, 900, 830),
        (100, 840, 900, 870),
        (100, 640, 900, 680),
        (100, 500, 900, 800),
        (100, 600, 900, 1000),
    ]
    lines = [f for f in kept if f[1].height < 100]
    assert sorted(b.as_tuple() for b, _ in tiles.merge(lines)) == [
        (100, 640, 900, 680),
        (100, 770, 900, 830),
        (100, 840, 900, 870),
    ]


def test_a_line_both_columns_cut_is_joined_whole() -> None:
    # SROIE receipt 429 (4961 px wide: two columns at detection scale 0.5). Its address line
    # runs past the left column's edge (2609) and starts left of the right column's core
    # (its share of the overlap starts at 2480), so neither column sees it whole; the right
    # column's piece was dropped as a sliver and the line read "...Johor Bahru,Joh".
    left, right = box(0, 1229, 2609, 2100), box(2352, 1229, 4961, 2100)
    found = [
        (0, box(1786, 1720, 2609, 1808), 0.9),  # the line, cut at the left column's edge
        (1, box(2289, 1726, 2670, 1810), 0.9),  # ... and its end, cut at the right's edge
        (0, box(2025, 1801, 2419, 1884), 0.9),  # the next line, whole in the left column
        (1, box(2289, 1801, 2421, 1884), 0.9),  # ... cut by the right column: a sliver
    ]
    kept = tiles.seam_slivers(found, [left, right], margin=8)
    assert [f[1].as_tuple() for f in kept] == [
        (1786, 1720, 2609, 1808),
        (2289, 1726, 2670, 1810),
        (2025, 1801, 2419, 1884),
    ]
    assert sorted(b.as_tuple() for b, _ in tiles.merge(kept, [left, right])) == [
        (1786, 1720, 2670, 1810),
        (2025, 1801, 2419, 1884),
    ]


@pytest.fixture(scope="module")
def detector() -> RapidDetector:
    return RapidDetector(threads=1)


def test_one_line_on_a_59_megapixel_page_is_read(detector: RapidDetector) -> None:
    """7700x7700 under the 60 Mpx limit, one 80 px line: scaled whole to 2000 px the line
    was lost (0 regions); on tiles it is found and read."""
    page = Image.new("L", (7700, 7700), 255)
    draw, face = ImageDraw.Draw(page), ImageFont.truetype(FONT, 80)
    draw.text((2900, 3950), LINE, fill=0, font=face)
    ink = draw.textbbox((2900, 3950), LINE, font=face)
    page = page.convert("RGB")
    regions = detector.detect(page)
    assert detector.last_plan is not None and detector.last_plan.method == "tiles"
    assert len(regions) == 1
    bbox = regions[0].bbox
    assert covers(bbox, ink) and bbox.height < 3 * (ink[3] - ink[1])
    ((text, _),) = RapidRecogniser(threads=1).recognise([crop(page, bbox)])
    assert cer(text, LINE) <= 0.05, text


@pytest.mark.parametrize("size", [(20000, 10), (20000, 60), (10, 20000), (3000, 10)])
def test_strips_of_extreme_aspect_ratio_are_detected(
    detector: RapidDetector, size: tuple[int, int]
) -> None:
    """rapidocr's own preprocessing raises ResizeImgError on these (or scales them up
    without bound); here they are padded windows, and text in a readable strip is found."""
    width, height = size
    page = Image.new("RGB", size, "white")
    face = ImageFont.truetype(FONT, 40)
    ink = ImageDraw.Draw(page).textbbox((20, 6), "strip text", font=face)
    if height == 60:
        ImageDraw.Draw(page).text((20, 6), "strip text", fill="black", font=face)
    regions = detector.detect(page)
    for region in regions:
        assert region.bbox.x1 <= width and region.bbox.y1 <= height
    if height == 60:  # the text is found (at half scale, its first word at least)
        assert len(regions) >= 1
        first = min(regions, key=lambda r: r.bbox.x0).bbox
        assert first.x0 <= ink[0] + 6 and first.y0 <= ink[1] + 6 and first.y1 >= ink[3] - 6


def test_bands_find_the_lines_a_whole_pass_finds(detector: RapidDetector) -> None:
    """A narrow page (its short side under 736 px, which the detector scales up) read in
    bands at the detector's own scale finds the lines a whole pass finds, where they are."""
    page = Image.new("RGB", (520, 1500), "white")
    draw, face = ImageDraw.Draw(page), ImageFont.truetype(FONT, 22)
    for n in range(22):
        draw.text(
            (24, 30 + 64 * n),
            f"{n + 1:02d} Item number {7 * n + 3} at 4.{n:02d}",
            fill="black",
            font=face,
        )
    banded = RapidDetector(threads=1, text_height=0)  # at the detector's own scale
    whole = RapidDetector(threads=1, text_height=0)
    whole._max_pixels = 10**9  # one window, as rapidocr reads a page
    seen, found = whole.detect(page), banded.detect(page)
    assert whole.last_plan is not None and whole.last_plan.method == "whole"
    assert banded.last_plan is not None and banded.last_plan.method == "tiles"
    assert len(seen) == len(found) == 22
    for a, b in zip(seen, found, strict=True):  # a band's edge shifts a box by a pixel or two
        edges = zip(a.bbox.as_tuple(), b.bbox.as_tuple(), strict=True)
        assert max(abs(u - v) for u, v in edges) <= 4


def _lines_page(size: tuple[int, int], font_px: int, count: int) -> Image.Image:
    page = Image.new("RGB", size, "white")
    draw, face = ImageDraw.Draw(page), ImageFont.truetype(FONT, font_px)
    for n in range(count):
        draw.text((60, 60 + 2 * font_px * n), f"{n + 1:02d} {LINE}", fill="black", font=face)
    return page


def test_tall_text_is_read_at_the_scale_it_needs(detector: RapidDetector) -> None:
    """A letter-size page of 56 px text: the survey finds its lines tall enough at a small
    scale, and the page is read there, with the lines and text found at full scale."""
    page = _lines_page((1700, 2200), 56, 12)
    full = RapidDetector(threads=1, text_height=0)
    seen, found = full.detect(page), detector.detect(page)
    assert full.last_plan is not None and detector.last_plan is not None
    assert detector.last_plan.scale < 0.6 * full.last_plan.scale, detector.last_plan
    assert len(found) == len(seen) == 12
    recogniser = RapidRecogniser(threads=1)
    for a, b in zip(seen, found, strict=True):
        edges = zip(a.bbox.as_tuple(), b.bbox.as_tuple(), strict=True)
        assert max(abs(u - v) for u, v in edges) <= 12
    texts = [t for t, _ in recogniser.recognise([crop(page, r.bbox) for r in found])]
    assert texts == [t for t, _ in recogniser.recognise([crop(page, r.bbox) for r in seen])]
    assert all(cer(t, f"{n:02d} {LINE}") <= 0.05 for n, t in enumerate(texts, start=1)), texts


def test_small_text_keeps_the_detectors_own_scale(detector: RapidDetector) -> None:
    """Text already as small as the detector needs is read at the scale it was before the
    survey, and so is a page of a few lines (too few to measure) and a page the detector
    reads at or above its own size (a receipt photo: no pixels to spare)."""
    full = RapidDetector(threads=1, text_height=0)
    pages = [_lines_page((1700, 2200), 16, 40), _lines_page((1700, 2200), 56, 2)]
    for page in (*pages, _lines_page((600, 1500), 40, 16)):
        seen, found = full.detect(page), detector.detect(page)
        assert detector.last_plan == full.last_plan
        assert [r.bbox for r in found] == [r.bbox for r in seen]
