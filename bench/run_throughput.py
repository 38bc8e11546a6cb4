"""Pages/min of `ocrfleet run` against a bare RapidOCR loop on the same real pages.

Both run in this process with the same onnxruntime thread budget (`--threads`, given to
RapidOCR's EngineConfig and to OCRFLEET_ONNX_THREADS), after a warm-up page each, and are
interleaved: bare, run, bare, run... for `--rounds` rounds (at least 3), so a slow spell on
a shared machine hits both. The bare loop is the floor: RapidOCR's own pipeline called on
each page image, nothing stored. `ocrfleet run` is the real thing with the scorer on:
split, page images to the store, regions, recognition, consensus scoring with its re-reads,
review, and every row written to SQLite.

    python bench/run_throughput.py [--pages 12] [--rounds 3] [--threads 2]

Prints each round's ratio; the last line reads `ratio run/bare: X.XX` (the median).
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


class Bare:
    """RapidOCR's own pipeline on each page image, nothing stored."""

    def __init__(self, pages: list[bytes], threads: int) -> None:
        from rapidocr import RapidOCR

        from ocrfleet.pipeline.images import load_image

        self.images = [np.asarray(load_image(data)) for data in pages]
        self.engine = RapidOCR(
            params={
                "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            }
        )
        self.engine(self.images[0])  # warm-up

    def __call__(self) -> float:
        started = time.perf_counter()
        for image in self.images:
            self.engine(image)
        return time.perf_counter() - started


class Run:
    """The same pages through ingest + process_page, as `ocrfleet run` does."""

    def __init__(self, pages: list[bytes], workdir: Path, threads: int) -> None:
        self.pages, self.round = pages, 0
        settings = Settings(
            database_url=f"sqlite:///{workdir / 'bench.db'}",
            store_url=f"file://{workdir / 'store'}",
            onnx_threads=threads,
        )
        upgrade(settings.database_url)
        self.ctx = Context(settings)
        warm = ingest(self.ctx, "warmup.png", data=pages[0])  # loads models, creates the run
        for page_id in warm.page_ids:
            process_page(self.ctx, page_id)

    def __call__(self) -> float:
        self.round += 1
        # A distinct input per page and round (the same bytes would be deduplicated), made
        # before the clock starts: tagging is the bench's work, not ocrfleet's.
        inputs = [
            (f"page{self.round}-{n}.png", tagged_png(data, f"{self.round}-{n}"))
            for n, data in enumerate(self.pages)
        ]
        started = time.perf_counter()
        for name, data in inputs:
            outcome = ingest(self.ctx, name, data=data)
            for page_id in outcome.page_ids:
                process_page(self.ctx, page_id)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rounds = max(3, args.rounds)
    pages = real_pages(Settings(), args.pages)
    n = len(pages)
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        bare, run = Bare(pages, args.threads), Run(pages, Path(tmp), args.threads)
        print(f"pages: {n}, threads: {args.threads}, rounds: {rounds}")
        for number in range(1, rounds + 1):
            bare_s, run_s = bare(), run()
            ratios.append(bare_s / run_s)
            print(
                f"round {number}: bare {60 * n / bare_s:.1f} pages/min ({bare_s:.1f} s), "
                f"ocrfleet run {60 * n / run_s:.1f} pages/min ({run_s:.1f} s), "
                f"ratio {ratios[-1]:.2f}"
            )
    print(f"ratio run/bare: {float(np.median(ratios)):.2f}")


if __name__ == "__main__":
    main()
