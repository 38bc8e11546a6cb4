"""Real scanned text lines with ground truth, for the scorer benchmarks (never for training).

Two sources under /work/shared/data/realdocs (see its README):

- uw3_500_ocropy: 100 binarised UW-III line images, each with its `.gt.txt`;
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
from dataclasses import dataclass

from PIL import Image

from bench.corpus import REALDOCS
from ocrfleet import ir
from ocrfleet.engines.base import Recogniser
from ocrfleet.metrics import cer, normalize_ws
from ocrfleet.pipeline.images import load_image
from ocrfleet.pipeline.regions import crop

UW3 = REALDOCS / "uw3_500_ocropy" / "lines"
UNLV = REALDOCS / "tesseract_test"
UNLV_PAGES = ("8071_093.3B", "8087_054.3B")
MAX_MATCH_CER = 0.34


@dataclass(frozen=True)
class RealLine:
    id: str
    image: Image.Image
    truth: str


def uw3_lines() -> list[RealLine]:
    lines = []
    for png in sorted(UW3.glob("*.png")):
        truth = normalize_ws(png.with_suffix("").with_suffix(".gt.txt").read_text(encoding="utf-8"))
        lines.append(RealLine(f"uw3/{png.stem}", load_image(png.read_bytes()), truth))
    return lines


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


def zone_line_crops(detector) -> list[tuple[str, str, Image.Image]]:
    """(id, page, line crop) for every detected line in every zone of the UNLV pages."""
    out = []
    for page in UNLV_PAGES:
        image = load_image((UNLV / f"{page}.tif").read_bytes())
        for z, zone in enumerate(_zones(page)):
            zone_image = crop(image, zone)
            boxes = [region.bbox for region in detector.detect(zone_image)]
            for n, box in enumerate(_merge_into_lines(boxes)):
                on_page = ir.BBox(
                    x0=zone.x0 + box.x0,
                    y0=zone.y0 + box.y0,
                    x1=zone.x0 + box.x1,
                    y1=zone.y0 + box.y1,
                )
                out.append((f"{page}/z{z}/l{n}", page, crop(image, on_page)))
    return out


def unlv_lines(detector, readers: Sequence[Recogniser], read) -> list[RealLine]:
    """Zone lines matched to ground truth (see the module docstring). `read(reader, images)`
    gives each reader's readings (a cache may stand behind it)."""
    crops = zone_line_crops(detector)
    readings = [read(reader, [image for _, _, image in crops]) for reader in readers]
    truths = {
        page: [
            normalize_ws(t) for t in (UNLV / f"{page}.txt").read_text(encoding="utf-8").splitlines()
        ]
        for page in UNLV_PAGES
    }
    used: set[tuple[str, int]] = set()
    lines = []
    for k, (line_id, page, image) in enumerate(crops):
        outputs = [normalize_ws(reading[k][0]) for reading in readings]
        best = None
        for n, truth in enumerate(truths[page]):
            if not truth:
                continue
            distance = min(cer(output, truth) for output in outputs)
            if best is None or distance < best[0]:
                best = (distance, n, truth)
        if best is None or best[0] > MAX_MATCH_CER or (page, best[1]) in used:
            continue
        used.add((page, best[1]))
        if "~" in best[2]:
            continue
        lines.append(RealLine(line_id, image, best[2]))
    return lines


def real_lines(detector, readers: Sequence[Recogniser], read) -> list[RealLine]:
    """UW3 lines then UNLV zone lines."""
    return uw3_lines() + unlv_lines(detector, readers, read)
