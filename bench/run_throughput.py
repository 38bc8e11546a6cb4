"""Pages/min of `ocrfleet run` with the verifier on and off, and against a bare RapidOCR
loop, on the same real pages: what the verifier costs, and what the whole pipeline costs.

Three arms run in this process on the same runtime (`engines.base.RUNTIME`: OpenVINO where
installed) with the same thread budget (`--threads`, given to RapidOCR's EngineConfig and to
OCRFLEET_ONNX_THREADS), each after a warm-up page, and are
interleaved: bare, run, run without verifier, bare, ... for `--rounds` rounds (at least 3),
so a slow spell on a shared machine hits all three.

- bare: RapidOCR's own pipeline (det + cls + rec) on each page image, nothing stored (the
  floor);
- run: ingest + process_page as `ocrfleet run` does them, with the configured scorer (the
  consensus verifier with its re-reads), review, every row written to SQLite;
- run, verifier off: the same, with the toolkit's scorer swapped for one that judges
  nothing (every unit `precheck_failed`, so every region goes to review): the pipeline
  without verification, its rows still written. Each run arm has its own database.

    python bench/run_throughput.py [--pages 12] [--rounds 3] [--threads 2]

Prints each round; the last lines read `ratio run/bare: X.XX` and `verifier share: X.XX`
(medians over rounds; the share is (run - run without verifier) / run, the verifier's part
of a page's time).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.scorers.base import Unit, judgement
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
        self.engine = RapidOCR(params=bare_params(threads))
        self.engine(self.images[0])  # warm-up

    def __call__(self) -> float:
        started = time.perf_counter()
        for image in self.images:
            self.engine(image)
        return time.perf_counter() - started


def bare_params(threads: int) -> dict[str, object]:
    """RapidOCR's own pipeline on the runtime ocrfleet's engines use (`engines.base.RUNTIME`),
    with the same thread budget: the ratio is then the pipeline's cost, not the runtime's."""
    from rapidocr.utils.typings import EngineType

    from ocrfleet.engines.base import RUNTIME

    if RUNTIME == "openvino":
        params: dict[str, object] = {
            "EngineConfig.openvino.inference_num_threads": threads,
            "EngineConfig.openvino.performance_hint": "LATENCY",
        }
    else:
        params = {
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
    for stage in ("Det", "Cls", "Rec"):
        params[f"{stage}.engine_type"] = EngineType(RUNTIME)
    return params


class Unverified:
    """A scorer that judges nothing: the pipeline with the verifier off (bench only)."""

    name = "off"
    version = "off"

    def score(self, units: list[Unit]) -> list[ir.Score]:
        return [
            judgement(self, unit, ir.Verdict.precheck_failed, error="verifier off (bench)")
            for unit in units
        ]


class Run:
    """The same pages through ingest + process_page, as `ocrfleet run` does; `verify`
    False swaps the scorer for `Unverified`."""

    def __init__(self, pages: list[bytes], workdir: Path, threads: int, verify: bool) -> None:
        self.pages, self.round, self.tag = pages, 0, "on" if verify else "off"
        workdir.mkdir()
        settings = Settings(
            database_url=f"sqlite:///{workdir / 'bench.db'}",
            store_url=f"file://{workdir / 'store'}",
            onnx_threads=threads,
        )
        upgrade(settings.database_url)
        self.ctx = Context(settings)
        if not verify:
            toolkit = dataclasses.replace(self.ctx.toolkit, scorer=Unverified())
            self.ctx.__dict__["toolkit"] = toolkit  # the cached_property's slot
        warm = ingest(self.ctx, "warmup.png", data=pages[0])  # loads models, creates the run
        for page_id in warm.page_ids:
            process_page(self.ctx, page_id)

    def __call__(self) -> float:
        self.round += 1
        # A distinct input per page and round (the same bytes would be deduplicated), made
        # before the clock starts: tagging is the bench's work, not ocrfleet's.
        inputs = [
            (f"page{self.round}-{n}.png", tagged_png(data, f"{self.tag}-{self.round}-{n}"))
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
    ratios, shares = [], []
    with tempfile.TemporaryDirectory() as tmp:
        bare = Bare(pages, args.threads)
        run = Run(pages, Path(tmp) / "on", args.threads, verify=True)
        off = Run(pages, Path(tmp) / "off", args.threads, verify=False)
        print(f"pages: {n}, threads: {args.threads}, rounds: {rounds}")
        for number in range(1, rounds + 1):
            bare_s, run_s, off_s = bare(), run(), off()
            ratios.append(bare_s / run_s)
            shares.append((run_s - off_s) / run_s)
            print(
                f"round {number}: bare {60 * n / bare_s:.1f} pages/min ({bare_s:.1f} s), "
                f"ocrfleet run {60 * n / run_s:.1f} pages/min ({run_s:.1f} s), "
                f"verifier off {60 * n / off_s:.1f} pages/min ({off_s:.1f} s), "
                f"ratio {ratios[-1]:.2f}, verifier share {shares[-1]:.2f}"
            )
    print(f"ratio run/bare: {float(np.median(ratios)):.2f}")
    print(f"verifier share: {float(np.median(shares)):.2f}")


if __name__ == "__main__":
    main()
