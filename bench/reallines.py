"""The UNLV pages' zones split into lines, for bench/realrows.py.

- tesseract_test: the two UNLV pages with zone files (8071_093.3B, 8087_054.3B). Zones are
  text blocks, so each zone is split into lines by the project's own RapidOCR detector
  (boxes on one text line merged into one line box). The page `.txt` gives the lines but
  not which zone or detected line they belong to, so each detected line takes the page's
  ground-truth line nearest to what the engines read (lowest CER of either engine). A line
  whose nearest ground truth is still more than 34% CER away (a detection that cut a line
  or merged two) is dropped, as is a ground-truth line containing `~` (UNLV's mark for a
  character it could not encode, e.g. an accent or an em dash), since no engine output can
  equal it; a ground-truth line taken by an earlier detection is not used twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.corpus import REALDOCS
from ocrfleet import ir

UW3 = REALDOCS / "uw3_500_ocropy" / "lines"
UNLV = REALDOCS / "tesseract_test"
UNLV_PAGES = ("8071_093.3B", "8087_054.3B")
MAX_MATCH_CER = 0.34


def _zones(page: str) -> list[ir.BBox]:
    boxes = []
    for row in (UNLV / f"{page}.uzn").read_text(encoding="utf-8").splitlines():
        parts = row.split()
        if len(parts) >= 4:
            x, y, w, h = (int(v) for v in parts[:4])
            boxes.append(ir.BBox(x0=x, y0=y, x1=x + w, y1=y + h))
    return boxes


def _merge_into_lines(boxes: Sequence[ir.BBox]) -> list[ir.BBox]:
    """Boxes that overlap vertically by more than half the smaller height are one line."""
    lines: list[ir.BBox] = []
    for box in sorted(boxes, key=lambda b: (b.y0 + b.y1, b.x0)):
        if lines:
            last = lines[-1]
            overlap = min(last.y1, box.y1) - max(last.y0, box.y0)
            if overlap > 0.5 * min(last.height, box.height):
                lines[-1] = ir.BBox(
                    x0=min(last.x0, box.x0),
                    y0=min(last.y0, box.y0),
                    x1=max(last.x1, box.x1),
                    y1=max(last.y1, box.y1),
                )
                continue
        lines.append(box)
    return lines
