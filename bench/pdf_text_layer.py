"""The searchable PDF's text layer on real scans: word recall of `pdftotext` against our
stored text, and how many of the word boxes `pdftotext -bbox` reports lie over ink.

Each scan of `--folder` (default: realdocs/tesseract_test) goes through the real pipeline
in this process (SQLite and a local store in a temporary folder), then `ocrfleet.formats`
renders the PDF. Recall counts words as a multiset; `-layout` keeps hyphenated line ends
as they are printed (pdftotext's default mode joins "be-" + "lieve" into "believe").
A box is over ink when more than 5% of its pixels are darker than 128.

    python bench/pdf_text_layer.py [--folder DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from lxml import etree  # noqa: E402

from bench.corpus import REALDOCS  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.db.migrate import upgrade  # noqa: E402
from ocrfleet.formats import load_document, render  # noqa: E402
from ocrfleet.pipeline.images import load_image  # noqa: E402
from ocrfleet.service import Context, ingest, process_page  # noqa: E402

SUFFIXES = {".tif", ".tiff", ".png", ".jpg", ".jpeg", ".pdf"}


def pdftotext(*args: str) -> str:
    return subprocess.run(["pdftotext", *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=REALDOCS / "tesseract_test")
    args = parser.parse_args()
    scans = sorted(p for p in args.folder.iterdir() if p.suffix.lower() in SUFFIXES)
    with tempfile.TemporaryDirectory(prefix="ocrfleet-pdf-") as tmp:
        root = Path(tmp)
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            database_url=f"sqlite:///{root / 'ocrfleet.db'}",
            store_url=f"file://{root / 'store'}",
        )
        upgrade(settings.database_url)
        ctx = Context(settings)
        total_words = total_found = 0
        for scan in scans:
            outcome = ingest(ctx, str(scan))
            for page_id in outcome.page_ids:
                process_page(ctx, page_id)
            with ctx.session() as session:
                doc = load_document(session, outcome.document_id)
            pdf = root / f"{scan.stem}.pdf"
            pdf.write_bytes(render(doc, "pdf", ctx.store))
            ours = Counter(render(doc, "text").decode().split())
            found = sum((ours & Counter(pdftotext("-layout", str(pdf), "-").split())).values())
            total_words += sum(ours.values())
            total_found += found
            xml = etree.fromstring(
                pdftotext("-bbox", str(pdf), "-").encode(), etree.XMLParser(recover=True)
            )
            inked = boxes = 0
            for page_el, page in zip(xml.iter("{*}page"), doc.pages, strict=True):
                image = load_image(ctx.store.get(ctx.store.key_of(page.image_uri))).convert("L")
                pixels = np.asarray(image)
                to_px = page.width / float(page_el.get("width"))
                for word in page_el.iter("{*}word"):
                    x0, y0, x1, y1 = (
                        round(float(word.get(k)) * to_px) for k in ("xMin", "yMin", "xMax", "yMax")
                    )
                    crop = pixels[y0:y1, x0:x1]
                    boxes += 1
                    inked += bool(crop.size and (crop < 128).mean() > 0.05)
            print(
                f"{scan.name}: {sum(ours.values())} words, pdftotext recall "
                f"{found / max(1, sum(ours.values())):.4f}, boxes over ink {inked}/{boxes}"
            )
        print(f"word recall over all scans: {total_found / max(1, total_words):.4f}")


if __name__ == "__main__":
    main()
