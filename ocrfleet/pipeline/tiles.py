"""Detection windows for pages a line detector cannot take whole, and the merge of the
boxes found in them.

A detector has an input size (RapidOCR: long side 2000 px). A page up to `1 / MIN_SCALE`
times that is detected scaled down as the detector does; a larger page would be scaled so
far that ordinary text vanishes (a 7700 px square page with a 100 px line came back empty),
so it is detected at `MIN_SCALE`. A strip too thin or too long for the detector (20000x10)
is cut along its length and each window padded with white to an aspect ratio the detector
accepts (`MAX_ASPECT`).

A detector's memory grows with its input's area (RapidOCR's DB under onnxruntime: ~250 MB
per megapixel on the first call of an input shape, ~160 MB on later ones), so no window
holds more than `max_pixels` at detection scale: a page over it is cut into the fewest
overlapping windows under that budget, all of one size, no wider than the detector takes
(full-width bands on ordinary pages, so no line is cut across its length). Windows of one
size share OVERLAP and no more: the page's area is read once, plus one overlap per seam.
Detection scale is the scale the detector would read the whole page at, its own upscaling
of a short side under `min_short` included, so a band is read on the pixels a whole-page
pass would see, however low it is.

A line cut at a window's edge is seen whole by the neighbour that overlaps it, so the cut
piece is dropped (`seam_slivers`); where one window joins what another sees as boxes side by
side, the pieces are kept (`finer`). Boxes of different windows are then merged when they are
the same text seen twice (most of the smaller one inside the other) or one line cut at a
window edge (side by side, sharing most of their height); boxes of one window are never
merged with each other.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from ocrfleet import ir

MIN_SCALE = 0.5  # never detect a page at less than half its size
MAX_PIXELS = 600_000  # per window at detection scale: eight bands for a letter page at 2000 px
OVERLAP = 128  # px at detection scale shared by neighbouring windows: taller than body text
MIN_WINDOW = 2 * OVERLAP  # px: the least band height, so a band is more than its overlaps
MAX_ASPECT = 8  # windows are padded to at most this long-to-short ratio (rapidocr: 8)
SAME_TEXT = 0.5  # share of the smaller box inside the other: the same text seen twice
SAME_LINE = 0.6  # share of the lower box's height two side-by-side boxes share: one line
OVERLAP_X = 24  # px two pieces of a split line may overlap (the detector widens its boxes)
EPSILON = 1e-9  # float slack in a window count, so an exact fit takes no extra window
# The revision of `seam_slivers`'s rule, in the detector's version (2: a piece its neighbour
# cannot see whole is kept)
SLIVER_RULE = 2


def plan(
    width: int,
    height: int,
    max_side: int,
    min_side: int,
    max_pixels: int = MAX_PIXELS,
    min_short: int = 0,
    wide_ratio: float = math.inf,
    scale: float | None = None,
) -> tuple[ir.DetectionPlan, list[ir.BBox]]:
    """How to detect a `width` x `height` page, and its windows in page pixels: `whole`
    (one window, the page) or `tiles`. `max_pixels`: a window's area at detection scale.
    The detector's own preprocessing of a whole page, which the windows keep: a page wider
    than `wide_ratio` times its height is padded to that ratio, then a short side under
    `min_short` is scaled up (not on a strip under `min_side` or a tall one, which are
    padded instead). A `scale` the caller chose (from the height of the page's text)
    replaces that preprocessing: the page is read in windows at that scale."""
    if scale is None:
        long_side = max(width, height)
        scale = max(MIN_SCALE, min(1.0, max_side / long_side))
        scaled_long = long_side * scale
        short = max(min(width, height) * scale, width * scale / wide_ratio)
        strip = min(width, height) * scale < min_side or height > MAX_ASPECT * width
        up = 1.0 if strip else max(1.0, min_short / short)
        if scaled_long <= max_side and scaled_long * short * up**2 <= max_pixels:
            whole = ir.BBox(x0=0, y0=0, x1=width, y1=height)
            return ir.DetectionPlan(method="whole", scale=scale, windows=1), [whole]
        scale *= up
    across = _equal(width * scale, max_side)
    rows = max(MIN_WINDOW, across / MAX_ASPECT, max_pixels / across)
    down = max(_equal(height * scale, min(max_side, rows)), min(MIN_WINDOW, height * scale))
    overlap = OVERLAP / scale
    xs = _starts(width, across / scale, overlap)
    ys = _starts(height, down / scale, overlap)
    size_x, size_y = math.ceil(across / scale), math.ceil(down / scale)
    windows = [
        ir.BBox(x0=x, y0=y, x1=min(width, x + size_x), y1=min(height, y + size_y))
        for y in ys
        for x in xs
    ]
    return ir.DetectionPlan(method="tiles", scale=scale, windows=len(windows)), windows


def _equal(length: float, most: float) -> float:
    """The window size that covers `length` with the fewest windows of at most `most`, all
    of one size and sharing exactly OVERLAP with each neighbour."""
    if length <= most:
        return length
    count = math.ceil((length - OVERLAP) / (most - OVERLAP) - EPSILON)
    return (length + (count - 1) * OVERLAP) / count


def _starts(length: int, size: float, overlap: float) -> list[int]:
    """Window starts covering 0..length with windows of `size` overlapping by >= `overlap`."""
    count = math.ceil((length - size) / (size - overlap) - EPSILON) + 1
    if count <= 1:
        return [0]
    step = (length - size) / (count - 1)
    return [round(i * step) for i in range(count)]


def padding(width: int, height: int, min_side: int) -> tuple[int, int]:
    """(right, bottom) white padding that gives a window an aspect ratio of at most
    MAX_ASPECT and a short side of at least `min_side`."""
    new_w = max(width, min_side, math.ceil(height / MAX_ASPECT))
    new_h = max(height, min_side, math.ceil(width / MAX_ASPECT))
    return new_w - width, new_h - height


def seam_slivers(
    found: Sequence[tuple[int, ir.BBox, float]], windows: Sequence[ir.BBox], margin: float
) -> list[tuple[int, ir.BBox, float]]:
    """`found` without the boxes a window cut at its edge where a neighbour sees them whole:
    a box that touches (within `margin` page pixels) an edge of its window that another
    window overlaps, with its centre past the middle of that overlap. A line cut at a
    seam leaves such a sliver, and a sliver a few pixels high would otherwise be merged
    with the next line as "one line cut at a window edge". A box the neighbour cannot see
    whole, because it reaches that neighbour's far edge too (a line longer than the
    overlap, cut by both columns; a box taller than the overlap, cut by both bands), keeps
    its pieces, and `merge` joins them."""
    shares = _shares(windows)
    kept = []
    for index, box, score in found:
        window, (core, (left, top, right, bottom)) = windows[index], shares[index]
        cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
        cut = (
            (box.x0 <= window.x0 + margin and cx < core.x0 and box.x1 < left - margin)
            or (box.x1 >= window.x1 - margin and cx > core.x1 and box.x0 > right + margin)
            or (box.y0 <= window.y0 + margin and cy < core.y0 and box.y1 < top - margin)
            or (box.y1 >= window.y1 - margin and cy > core.y1 and box.y0 > bottom + margin)
        )
        if not cut:
            kept.append((index, box, score))
    return kept


def finer(found: Sequence[tuple[int, ir.BBox, float]]) -> list[tuple[int, ir.BBox, float]]:
    """`found` without the boxes that another window saw as two or more boxes side by side
    (each mostly inside it): where windows disagree, the detector joining two columns
    across a narrow gutter is the common error, not splitting one line."""
    window = np.array([w for w, _, _ in found], dtype=np.int64)
    if len(set(window.tolist())) < 2:
        return list(found)
    boxes = np.array([b.as_tuple() for _, b, _ in found], dtype=np.int64).reshape(-1, 4)
    dropped = set()
    for i, inner in _inside_other_window(window, boxes):
        pieces: dict[int, list[ir.BBox]] = {}
        for j in inner:
            pieces.setdefault(int(window[j]), []).append(found[j][1])
        for side_by_side in pieces.values():
            side_by_side.sort(key=lambda b: b.x0)
            if len(side_by_side) > 1 and all(
                left.x1 <= right.x0 + OVERLAP_X for left, right in itertools.pairwise(side_by_side)
            ):
                dropped.add(i)
    return [f for i, f in enumerate(found) if i not in dropped]


def _inside_other_window(
    window: np.ndarray, boxes: np.ndarray, rows: int = 256
) -> Iterator[tuple[int, np.ndarray]]:
    """(i, the j of the narrower boxes of other windows mostly inside box i, ascending) for
    every i with any: `ir.BBox.share_inside` over every pair at once (the same float from
    the same ints), `rows` boxes i at a time so that a page of thousands of boxes stays
    within a few MB. One pair at a time in Python took 10.4 ms for the 146 boxes of a UNLV
    scan, this 0.65 ms."""
    x0, y0, x1, y1 = boxes.T
    width = x1 - x0
    area = np.maximum(1, width * (y1 - y0))
    for start in range(0, len(boxes), rows):
        a = slice(start, start + rows)
        w = np.minimum(x1[a, None], x1[None, :]) - np.maximum(x0[a, None], x0[None, :])
        h = np.minimum(y1[a, None], y1[None, :]) - np.maximum(y0[a, None], y0[None, :])
        inside = (w > 0) & (h > 0) & (w * h / area[None, :] >= SAME_TEXT)
        inside &= (window[a, None] != window[None, :]) & (width[None, :] < width[a, None])
        for offset in np.flatnonzero(inside.any(axis=1)):
            yield start + int(offset), np.flatnonzero(inside[offset])


def _shares(windows: Sequence[ir.BBox]) -> list[tuple[ir.BBox, tuple[int, int, int, int]]]:
    """Per window, its core and its reach.

    The core is the window's share of the page: its box, with every edge another window
    overlaps moved to the middle of that overlap. The reach (left, top, right, bottom) says
    where the neighbour over each edge ends on the far side: left is the right edge of the
    window overlapping its left edge, right the left edge of the one overlapping its right
    edge (top, bottom likewise; a middle window's left is right of its right), and the
    window's own edge where no window overlaps it, so that no box is a sliver there. A box
    cut at an edge is seen whole by that neighbour only if it ends short of its reach."""
    shares = []
    for window in windows:
        core = [window.x0, window.y0, window.x1, window.y1]
        reach = list(core)
        for other in windows:
            if other is window:
                continue
            rows = min(window.y1, other.y1) > max(window.y0, other.y0)
            columns = min(window.x1, other.x1) > max(window.x0, other.x0)
            if rows and other.x0 < window.x0 < other.x1 <= window.x1:
                core[0] = max(core[0], (window.x0 + other.x1) // 2)
                reach[0] = max(reach[0], other.x1)
            if rows and window.x0 <= other.x0 < window.x1 < other.x1:
                core[2] = min(core[2], (other.x0 + window.x1) // 2)
                reach[2] = min(reach[2], other.x0)
            if columns and other.y0 < window.y0 < other.y1 <= window.y1:
                core[1] = max(core[1], (window.y0 + other.y1) // 2)
                reach[1] = max(reach[1], other.y1)
            if columns and window.y0 <= other.y0 < window.y1 < other.y1:
                core[3] = min(core[3], (other.y0 + window.y1) // 2)
                reach[3] = min(reach[3], other.y0)
        x0, y0, x1, y1 = core
        shares.append(
            (ir.BBox(x0=x0, y0=y0, x1=x1, y1=y1), (reach[0], reach[1], reach[2], reach[3]))
        )
    return shares


def merge(
    found: Sequence[tuple[int, ir.BBox, float]], windows: Sequence[ir.BBox] | None = None
) -> list[tuple[ir.BBox, float]]:
    """(window index, box, score) from every window -> merged (box, best score). With
    `windows`, two boxes side by side are one line cut at a seam only when their windows
    are side by side too (a band above another cuts no line across its length: the two are
    neighbouring columns)."""
    parent = list(range(len(found)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    order = sorted(range(len(found)), key=lambda i: found[i][1].y0)
    for pos, i in enumerate(order):
        wi, a, _ = found[i]
        for j in order[pos + 1 :]:
            wj, b, _ = found[j]
            if b.y0 >= a.y1:
                break
            if wi == wj:
                continue
            beside = windows is None or windows[wi].x0 != windows[wj].x0
            if _same(a, b, beside):
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(found)):
        groups.setdefault(root(i), []).append(i)
    merged = []
    for members in groups.values():
        boxes = [found[i][1] for i in members]
        union = ir.BBox(
            x0=min(b.x0 for b in boxes),
            y0=min(b.y0 for b in boxes),
            x1=max(b.x1 for b in boxes),
            y1=max(b.y1 for b in boxes),
        )
        merged.append((union, max(found[i][2] for i in members)))
    return merged


def _same(a: ir.BBox, b: ir.BBox, beside: bool = True) -> bool:
    dx = min(a.x1, b.x1) - max(a.x0, b.x0)
    dy = min(a.y1, b.y1) - max(a.y0, b.y0)
    if dx <= 0 or dy <= 0:
        return False
    smaller = min(a.width * a.height, b.width * b.height)
    if dx * dy >= SAME_TEXT * smaller:
        return True
    return beside and dy >= SAME_LINE * min(a.height, b.height)
