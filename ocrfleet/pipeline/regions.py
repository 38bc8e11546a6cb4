"""Region detection stage: page -> text-line regions in reading order, and the one crop.

Reading order is decided here and only here, so every detector's regions are numbered the
same way and region numbers stay stable across engines, scorers and reruns.

How the order is found: a recursive XY-cut on the detected boxes (not on pixels).

- Cuts look at each box's *core*: the box shrunk on every side by `CORE_MARGIN` of its
  height. Line detectors pad their boxes (RapidOCR's DB boxes by about 0.3 of their height),
  so on the raw boxes neighbouring lines overlap and narrow column gutters close up.
- A *gutter* is an x-range at least `GUTTER_FACTOR` median box heights wide, with boxes on
  both sides, that no core crosses (strict) or at most `CROSSING_SHARE` of the group's
  cores cross (tolerant). A box crossing a gutter goes to the leftmost column it touches.

1. A group is cut at every horizontal gap between cores into strips. Neighbouring strips
   merge while the merged group keeps a strict gutter (the body of a multi-column section)
   or while neither has one (running text). Then column groups that only boxes crossing
   their gutter keep apart (a caption set into the gutter, a line the detector merged
   across it), directly or through a gutter-less strip narrower than `NARROW_SHARE` of the
   columns, are joined if a tolerant gutter survives. A title, heading or footer spanning
   most of the width stays its own group, so a title reads before the columns under it and
   the sections above and below a full-width heading read one after the other. The groups
   are ordered top to bottom, each on its own.
2. A group that step 1 leaves whole is split at its tolerant gutters into columns, left to
   right, each ordered on its own.
3. A group that no cut changes is one block of lines: its boxes are grouped into bands (a
   box joins a band when its vertical centre lies inside the band's span and the band's
   centre inside the box's span), bands top to bottom, boxes in a band left to right.

The constants were set on the two multi-column UNLV pages of realdocs/tesseract_test and
the layouts in tests/unit/test_regions.py; they are heuristics, not a layout model. Known
limits: a table whose cells line up in columns reads column by column; a caption inside a
gutter is read within the column it starts in; the lines of a strip that a full-width
box ties together (e.g. a drop cap beside a merged line) read band by band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PIL import Image

from ocrfleet import ir

if TYPE_CHECKING:
    from ocrfleet.engines.base import Detector

CORE_MARGIN = 0.3  # of a box's height, taken off each side for cutting
GUTTER_FACTOR = 0.5  # minimum gutter width, in median box heights
CROSSING_SHARE = 0.1  # of a group's boxes that may cross a gutter
NARROW_SHARE = 0.5  # a gutter-less strip narrower than this share of the columns interrupts

_Span = tuple[float, float]


def polygon_bbox(points: Sequence[Sequence[float]], width: int, height: int) -> ir.BBox | None:
    """The axis-aligned box around a polygon, clipped to the page; None if nothing is left."""
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    x0 = min(max(math.floor(min(xs)), 0), width)
    y0 = min(max(math.floor(min(ys)), 0), height)
    x1 = min(max(math.ceil(max(xs)), 0), width)
    y1 = min(max(math.ceil(max(ys)), 0), height)
    if x1 <= x0 or y1 <= y0:
        return None
    return ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1)


def clip_bbox(bbox: ir.BBox, width: int, height: int) -> ir.BBox | None:
    """`bbox` clipped to a width x height page; None if it has no area left."""
    return polygon_bbox([(bbox.x0, bbox.y0), (bbox.x1, bbox.y1)], width, height)


def reading_order(boxes: Sequence[ir.BBox], line_height: float | None = None) -> list[int]:
    """Indices of `boxes` in reading order (see the module docstring).

    For boxes that are blocks of many lines (layout blocks), pass the page's median text
    line height: gutters and core margins are then measured in lines, not in block heights.
    """
    if not boxes:
        return []
    unit = line_height
    if unit is None:
        heights = sorted(b.height for b in boxes)
        unit = heights[len(heights) // 2]
    gutter = max(1.0, GUTTER_FACTOR * unit)
    cores = [_core(b, line_height) for b in boxes]
    order: list[int] = []
    _order_group(list(range(len(boxes))), boxes, cores, gutter, order)
    return order


def row_order(boxes: Sequence[ir.BBox]) -> list[int]:
    """Indices of `boxes` row by row, left to right: the order of a table's cells, which
    the XY-cut would read column by column."""
    return _band_order(list(range(len(boxes))), boxes)


def order_regions(regions: Sequence[ir.Region]) -> list[ir.Region]:
    """`regions` sorted into reading order and renumbered 1..n."""
    order = reading_order([r.bbox for r in regions])
    return [regions[i].model_copy(update={"number": n}) for n, i in enumerate(order, start=1)]


def detect_regions(page: Image.Image, detector: Detector) -> list[ir.Region]:
    """Regions of `page` from `detector`, clipped to the page, empty ones dropped, in reading
    order and numbered from 1, whatever order the detector returned them in; regions in
    layout blocks keep the layout detector's order (blocks first, then lines)."""
    kept = []
    for region in detector.detect(page):
        bbox = clip_bbox(region.bbox, page.width, page.height)
        if bbox is not None:
            kept.append(region.model_copy(update={"bbox": bbox}))
    if any(region.block is not None for region in kept):  # a layout detector's block order
        return [r.model_copy(update={"number": n}) for n, r in enumerate(kept, start=1)]
    return order_regions(kept)


def crop(page: Image.Image, bbox: ir.BBox) -> Image.Image:
    """The pixels of `bbox` on `page`: the one crop every engine and scorer sees.

    A box reaching outside the page is an error (not silently padded), because scorers
    compare candidates on identical pixels. A zero-area box gives a zero-area image; the
    engines reject it with their own error.
    """
    if bbox.x1 > page.width or bbox.y1 > page.height:
        raise ValueError(f"bbox {bbox.as_tuple()} reaches outside the {page.size} page")
    return page.crop(bbox.as_tuple())


def _core(b: ir.BBox, line_height: float | None = None) -> tuple[_Span, _Span]:
    """(x span, y span) of the box shrunk by CORE_MARGIN of its height (of at most one line
    height); never empty."""
    m = CORE_MARGIN * (b.height if line_height is None else min(b.height, line_height))

    def shrink(lo: int, hi: int) -> _Span:
        if hi - lo > 2 * m:
            return (lo + m, hi - m)
        mid = (lo + hi) / 2
        return (mid, mid + 0.5)

    return shrink(b.x0, b.x1), shrink(b.y0, b.y1)


def _order_group(
    ids: list[int],
    boxes: Sequence[ir.BBox],
    cores: Sequence[tuple[_Span, _Span]],
    gutter: float,
    out: list[int],
) -> None:
    strips = _cut(ids, cores, axis=1, min_gap=0.0, crossing=0.0)
    groups = _merge_strips(strips, cores, gutter) if len(strips) > 1 else [ids]
    if len(groups) == 1:
        groups = _cut(ids, cores, axis=0, min_gap=gutter, crossing=CROSSING_SHARE)
    if len(groups) > 1:
        for group in groups:
            _order_group(group, boxes, cores, gutter, out)
        return
    out.extend(_band_order(ids, boxes))


def _cut(
    ids: list[int],
    cores: Sequence[tuple[_Span, _Span]],
    axis: int,
    min_gap: float,
    crossing: float,
) -> list[list[int]]:
    """Split `ids` at interior gaps along x (axis 0) or y (axis 1): runs at least `min_gap`
    long (and longer than zero) that at most `crossing` of the cores cover. Each box goes to
    the part its core starts in, the leftmost (topmost) part it touches."""
    allowed = int(crossing * len(ids))
    events = sorted([(cores[i][axis][0], 1) for i in ids] + [(cores[i][axis][1], -1) for i in ids])
    gaps: list[_Span] = []
    depth, seen_high, low_from = 0, False, None
    for position, step in events:
        depth += step
        if depth > allowed:
            if low_from is not None and position - low_from >= max(min_gap, 1e-9):
                gaps.append((low_from, position))
            seen_high, low_from = True, None
        elif seen_high and low_from is None:
            low_from = position
    if not gaps:
        return [ids]
    parts: list[list[int]] = [[] for _ in range(len(gaps) + 1)]
    for i in ids:
        start = cores[i][axis][0]
        parts[sum(1 for g in gaps if g[0] <= start)].append(i)
    return [part for part in parts if part]


def _merge_strips(
    strips: list[list[int]], cores: Sequence[tuple[_Span, _Span]], gutter: float
) -> list[list[int]]:
    def has_gutter(ids: list[int], crossing: float = 0.0) -> bool:
        return len(_cut(ids, cores, axis=0, min_gap=gutter, crossing=crossing)) > 1

    groups = [strips[0]]
    split = [has_gutter(strips[0])]
    for strip in strips[1:]:
        merged = groups[-1] + strip
        # Columns continue while the gutter survives; running text while no gutter appears.
        if has_gutter(merged) if split[-1] else not has_gutter(strip):
            groups[-1] = merged
        else:
            groups.append(strip)
            split.append(has_gutter(strip))

    # Column groups separated only by boxes that cross their gutter (a caption set into the
    # gutter, a narrow pull quote) are one set of columns: join two neighbouring column
    # groups, or two with a narrow gutter-less group between them, when a gutter survives
    # with CROSSING_SHARE tolerance. A title, footer or heading spanning most of the width
    # stays apart, so sections above and below it are read one after the other.
    def narrow(ids: list[int], around: list[int]) -> bool:
        span = max(cores[i][0][1] for i in around) - min(cores[i][0][0] for i in around)
        width = max(cores[i][0][1] for i in ids) - min(cores[i][0][0] for i in ids)
        return width < NARROW_SHARE * span

    i = 0
    while i < len(groups):
        last = i  # the furthest column group reachable through column or narrow groups
        while split[i] and last + 1 < len(groups):
            if split[last + 1]:
                last += 1
            elif (
                last + 2 < len(groups)
                and split[last + 2]
                and narrow(groups[last + 1], groups[last] + groups[last + 2])
            ):
                last += 2
            else:
                break
        for end in range(last, i, -1):
            joined = [j for group in groups[i : end + 1] for j in group]
            if split[end] and has_gutter(joined, CROSSING_SHARE):
                groups[i : end + 1], split[i : end + 1] = [joined], [True]
                break
        i += 1
    return groups


def _band_order(ids: list[int], boxes: Sequence[ir.BBox]) -> list[int]:
    bands: list[list[int]] = []
    top = bottom = 0.0
    for i in sorted(ids, key=lambda i: (boxes[i].y0 + boxes[i].y1, boxes[i].x0, i)):
        b = boxes[i]
        centre = (b.y0 + b.y1) / 2
        if bands and top <= centre <= bottom and b.y0 <= (top + bottom) / 2 <= b.y1:
            bands[-1].append(i)
            top, bottom = min(top, b.y0), max(bottom, b.y1)
        else:
            bands.append([i])
            top, bottom = b.y0, b.y1
    bands.sort(key=lambda band: (min(boxes[i].y0 for i in band), band[0]))
    return [i for band in bands for i in sorted(band, key=lambda i: (boxes[i].x0, i))]
