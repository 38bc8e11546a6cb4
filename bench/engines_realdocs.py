"""Character error rate of the region stages on the tesseract_test realdocs pages.

1. full page: detect_regions (RapidOCR lines, our reading order) + recognise, per engine,
   against the page's `.txt` ground truth (whitespace folded, so reading order counts).
2. zones: the `.uzn` zones (UNLV pages only) in file order; each zone is a block of lines,
   so lines are detected inside the zone crop and every engine reads the same line crops.
   This takes page-level reading order out of the number.

    python bench/engines_realdocs.py [--realdocs ../shared/data/realdocs] [--batch 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.corpus import REALDOCS  # noqa: E402
from ocrfleet import ir  # noqa: E402
from ocrfleet.engines.rapidocr import RapidDetector, RapidRecogniser  # noqa: E402
from ocrfleet.engines.tesseract import TesseractRecogniser  # noqa: E402
from ocrfleet.metrics import cer  # noqa: E402
from ocrfleet.pipeline.recognise import recognise  # noqa: E402
from ocrfleet.pipeline.regions import crop, detect_regions  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAGES = ["phototest", "eurotext", "8071_093.3B", "8087_054.3B"]


def page_text(page: Image.Image, detector, recognisers) -> dict[str, str]:
    regions = detect_regions(page, detector)
    candidates = recognise(page, regions, recognisers)
    return {
        rec.name: "\n".join(c.text for c in candidates if c.engine == rec.name)
        for rec in recognisers
    }


def zones(path: Path) -> list[ir.BBox]:
    boxes = []
    for line in path.read_text().splitlines():
        if line.strip():
            x, y, w, h = (int(v) for v in line.split()[:4])
            boxes.append(ir.BBox(x0=x, y0=y, x1=x + w, y1=y + h))
    return boxes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--realdocs", type=Path, default=REALDOCS)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    folder = args.realdocs / "tesseract_test"
    detector = RapidDetector()
    recognisers = [RapidRecogniser(batch_size=args.batch), TesseractRecogniser()]
    print(
        f"detector {detector.version}; " + ", ".join(f"{r.name} {r.version}" for r in recognisers)
    )
    print(f"{'page':<14}{'mode':<7}" + "".join(f"{r.name:>11}" for r in recognisers))
    for name in PAGES:
        page = Image.open(folder / f"{name}.tif").convert("RGB")
        truth = (folder / f"{name}.txt").read_text(encoding="utf-8")
        texts = page_text(page, detector, recognisers)
        row = "".join(f"{cer(texts[r.name], truth):>11.4f}" for r in recognisers)
        print(f"{name:<14}{'page':<7}{row}")
        uzn = folder / f"{name}.uzn"
        if uzn.exists():
            parts: dict[str, list[str]] = {r.name: [] for r in recognisers}
            for zone in zones(uzn):
                zone_page = crop(page, zone)
                for engine, text in page_text(zone_page, detector, recognisers).items():
                    parts[engine].append(text)
            joined = {engine: "\n".join(texts) for engine, texts in parts.items()}
            row = "".join(f"{cer(joined[r.name], truth):>11.4f}" for r in recognisers)
            print(f"{name:<14}{'zones':<7}{row}")


if __name__ == "__main__":
    main()
