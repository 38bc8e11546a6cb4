"""PDF text layers, both ways: the one our searchable PDF writes, and the one an input has.

Output (default): the searchable PDF's text layer on real scans: word recall of `pdftotext`
against our stored text, and how many of the word boxes `pdftotext -bbox` reports lie over
ink.

Each scan of `--folder` (default: realdocs/tesseract_test) goes through the real pipeline
in this process (SQLite and a local store in a temporary folder), then `ocrfleet.formats`
renders the PDF. Recall counts words as a multiset; `-layout` keeps hyphenated line ends
as they are printed (pdftotext's default mode joins "be-" + "lieve" into "believe").
A box is over ink when more than 5% of its pixels are darker than 128.

    python bench/pdf_text_layer.py [--folder DIR]

Inputs (`--inputs`): every PDF of `--pdfs` (default: realdocs' olmOCR sample) read twice
in this process, with OCRFLEET_TEXT_LAYER=use and =redo: per page, whether its layer is
used (and why not) with the evidence (ink coverage, characters without Unicode); per
document, the seconds each way, the share of regions accepted without review each way, and
the word recall of the OCR's text against the text layer's (a born-digital page's layer is
its author's text).

    python bench/pdf_text_layer.py --inputs [--pdfs DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
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


def word_recall(truth: str, found: str) -> float:
    want = Counter(truth.split())
    return sum((want & Counter(found.split())).values()) / max(1, sum(want.values()))


def read_pdf(ctx: Context, pdf: Path) -> tuple[float, str, list, object]:
    """Seconds to read `pdf` (split included), its text, its pages' params, its summary."""
    from ocrfleet.db import models
    from ocrfleet.report import document_summaries

    started = time.perf_counter()
    outcome = ingest(ctx, str(pdf))
    for page_id in outcome.page_ids:
        process_page(ctx, page_id)
    seconds = time.perf_counter() - started
    with ctx.session() as session:
        doc = load_document(session, outcome.document_id)
        params = [session.get(models.Page, page_id).params for page_id in outcome.page_ids]
        summary = document_summaries(session, [outcome.document_id])[0]
    return seconds, render(doc, "text").decode(), params, summary


def inputs(folder: Path, root: Path) -> None:
    contexts = {}
    for mode in ("use", "redo"):
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            database_url=f"sqlite:///{root / mode}.db",
            store_url=f"file://{root / mode}",
            text_layer=mode,
        )
        upgrade(settings.database_url)
        contexts[mode] = Context(settings)
        contexts[mode].toolkit  # noqa: B018  (models loaded before the clock starts)
    totals = {"use": 0.0, "redo": 0.0}
    layer_recall = []
    for pdf in sorted(folder.glob("*.pdf")):
        use = read_pdf(contexts["use"], pdf)
        redo = read_pdf(contexts["redo"], pdf)
        totals["use"] += use[0]
        totals["redo"] += redo[0]
        judged = [p.get("text_layer") for p in use[2]]
        used = sum(bool(j and j["used"]) for j in judged)
        evidence = "; ".join(
            "none" if j is None else f"{j['why']} (ink {j['ink_coverage']:.3f})" for j in judged
        )
        accepted = {
            mode: 1 - summary.flagged / max(1, summary.regions)
            for mode, (_, _, _, summary) in (("use", use), ("redo", redo))
        }
        line = (
            f"{pdf.name}: layer used on {used}/{len(judged)} page(s) [{evidence}]; "
            f"{use[0]:.1f} s vs {redo[0]:.1f} s OCR; accepted {accepted['use']:.2f} vs "
            f"{accepted['redo']:.2f}"
        )
        if used == len(judged):
            recall = word_recall(use[1], redo[1])
            layer_recall.append(recall)
            line += f"; OCR word recall against the layer {recall:.3f}"
        print(line)
        sys.stdout.flush()
    print(
        f"all: {totals['use']:.1f} s with text layers, {totals['redo']:.1f} s OCR "
        f"(ratio {totals['redo'] / max(totals['use'], 1e-9):.2f}); OCR word recall against "
        f"the layers {sum(layer_recall) / max(1, len(layer_recall)):.3f} "
        f"on {len(layer_recall)} documents"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=REALDOCS / "tesseract_test")
    parser.add_argument("--inputs", action="store_true", help="input text layers, use vs redo")
    parser.add_argument("--pdfs", type=Path, default=REALDOCS / "olmocr_bench_sample" / "pdfs")
    args = parser.parse_args()
    if args.inputs:
        with tempfile.TemporaryDirectory(prefix="ocrfleet-layers-") as tmp:
            inputs(args.pdfs, Path(tmp))
        return
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
