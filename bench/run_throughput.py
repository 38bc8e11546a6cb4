"""Pages/min of `ocrfleet run` against a bare RapidOCR loop on the same rendered pages.

Both run in this process, one after the other, after a warm-up page each. The bare loop is
the floor: RapidOCR's own pipeline called on each page image, nothing stored. `ocrfleet run`
is the real thing: split, page images to the store, regions, recognition, scoring, review,
and every row written to SQLite.

    python bench/run_throughput.py [--pages 12] [--rounds 1]

The last line reads `ratio run/bare: X.XX`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.service import Context, ingest, process_page

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import real_pages, tagged_png  # noqa: E402


def bare_loop(pages: list[bytes]) -> float:
    from rapidocr import RapidOCR

    from ocrfleet.pipeline.images import load_image

    engine = RapidOCR()
    engine(np.asarray(load_image(pages[0])))  # warm-up
    started = time.perf_counter()
    for data in pages:
        engine(np.asarray(load_image(data)))
    return time.perf_counter() - started


def ocrfleet_run(pages: list[bytes], workdir: Path) -> float:
    settings = Settings(
        database_url=f"sqlite:///{workdir / 'bench.db'}", store_url=f"file://{workdir / 'store'}"
    )
    upgrade(settings.database_url)
    ctx = Context(settings)
    warm = ingest(ctx, "warmup.png", data=pages[0])  # loads models, creates the run
    for page_id in warm.page_ids:
        process_page(ctx, page_id)
    started = time.perf_counter()
    for number, data in enumerate(pages):
        # A distinct input per page (the same bytes would be deduplicated).
        outcome = ingest(ctx, f"page{number}.png", data=tagged_png(data, str(number)))
        for page_id in outcome.page_ids:
            process_page(ctx, page_id)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=12)
    args = parser.parse_args()
    pages = real_pages(Settings(), args.pages)
    with tempfile.TemporaryDirectory() as tmp:
        bare = bare_loop(pages)
        run = ocrfleet_run(pages, Path(tmp))
    n = len(pages)
    print(f"pages: {n}")
    print(f"bare rapidocr loop: {60 * n / bare:.1f} pages/min ({bare:.1f} s)")
    print(f"ocrfleet run: {60 * n / run:.1f} pages/min ({run:.1f} s)")
    print(f"ratio run/bare: {bare / run:.2f}")


if __name__ == "__main__":
    main()
