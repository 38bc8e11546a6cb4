"""What the CTC readers cost per line, and how well they read: RapidOCR and EasyOCR on the
same real lines (UW3 book lines, or SROIE receipt line boxes), rounds interleaved, the same
onnxruntime thread budget.

Prints, per engine, the median milliseconds per line over the rounds and the character
error rate against the ground truth; the ratio EasyOCR / RapidOCR; what building RapidOCR's
posteriors adds to its reading (the pruning, timed inside the same calls); and what one
cross-score (`Posterior.log_likelihood` of the other engine's reading) costs, alone and
with three texts in one `log_likelihoods` call.

    python bench/ctc_engines.py [--set uw3|sroie] [--lines 100] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.corpus import REALDOCS, SROIE, receipt_crops  # noqa: E402
from ocrfleet.engines.easyocr import EasyOCRRecogniser  # noqa: E402
from ocrfleet.engines.rapidocr import RapidRecogniser  # noqa: E402
from ocrfleet.metrics import levenshtein  # noqa: E402
from ocrfleet.pipeline.images import load_image  # noqa: E402
from ocrfleet.scorers import ctc  # noqa: E402


def _uw3_lines(count: int) -> tuple[list[Image.Image], list[str]]:
    pngs = sorted((REALDOCS / "uw3_500_ocropy" / "book").glob("*/*.bin.png"))[:count]
    if not pngs:
        raise SystemExit(f"no UW3 lines under {REALDOCS}")
    crops = [load_image(p.read_bytes()) for p in pngs]
    truth = [" ".join(p.with_name(p.name[:-8] + ".gt.txt").read_text().split()) for p in pngs]
    return crops, truth


def _sroie_lines(count: int) -> tuple[list[Image.Image], list[str]]:
    """The annotated line boxes of every 15th receipt, cut from the scan, up to `count`."""
    crops: list[Image.Image] = []
    truth: list[str] = []
    for image in sorted((SROIE / "images").glob("*.jpg"))[::15]:
        more, texts = receipt_crops([image])
        crops += more
        truth += (" ".join(text.split()) for text in texts)
        if len(crops) >= count:
            break
    if not crops:
        raise SystemExit(f"no SROIE receipts under {SROIE}")
    return crops[:count], truth[:count]


def _cer(texts: list[str], truth: list[str], fold: bool) -> float:
    """Character error rate; `fold`: case-insensitive (SROIE's transcripts are upper-cased
    where the print is not)."""
    if fold:
        texts, truth = [t.casefold() for t in texts], [t.casefold() for t in truth]
    return sum(map(levenshtein, texts, truth)) / sum(len(t) for t in truth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("uw3", "sroie"), default="uw3")
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=Path("ocrfleet-cache"))
    args = parser.parse_args()
    crops, truth = (_uw3_lines if args.set == "uw3" else _sroie_lines)(args.lines)
    fold = args.set == "sroie"
    rapid = RapidRecogniser(threads=args.threads)
    easy = EasyOCRRecogniser(threads=args.threads, cache_dir=args.cache_dir)
    engines = {"rapidocr": rapid, "easyocr": easy}
    for engine in engines.values():  # warm up: first calls allocate
        engine.recognise(crops[:4])

    prune_s = 0.0
    original_prune = ctc.prune

    def timed_prune(*a, **k):
        nonlocal prune_s
        start = time.perf_counter()
        try:
            return original_prune(*a, **k)
        finally:
            prune_s += time.perf_counter() - start

    ctc.prune = timed_prune
    times: dict[str, list[float]] = {name: [] for name in engines}
    texts: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            ctc.RECENT.clear()
            start = time.perf_counter()
            texts[name] = [text for text, _ in engine.recognise(crops)]
            times[name].append(time.perf_counter() - start)
    ctc.prune = original_prune

    n = len(crops)
    print(
        f"{n} {args.set} lines, {args.rounds} interleaved rounds, "
        f"{args.threads} onnxruntime thread(s)"
    )
    for name in engines:
        ms = statistics.median(times[name]) / n * 1000
        cer = _cer(texts[name], truth, fold)
        print(f"{name}: {ms:.1f} ms/line (median round), CER {cer:.4f}{' (casefold)' * fold}")
    ratio = statistics.median(times["easyocr"]) / statistics.median(times["rapidocr"])
    print(f"easyocr/rapidocr time: {ratio:.2f}")
    print(f"rapidocr posterior pruning: {prune_s / sum(times['rapidocr']):.3f} of its reading time")

    posteriors = {name: engine.posteriors(crops) for name, engine in engines.items()}
    start = time.perf_counter()
    for name, other in (("rapidocr", "easyocr"), ("easyocr", "rapidocr")):
        for posterior, text in zip(posteriors[name], texts[other], strict=True):
            posterior.log_likelihood(text)
    one_ms = (time.perf_counter() - start) / (2 * n) * 1000
    print(f"cross-score (log_likelihood of the other engine's reading): {one_ms:.2f} ms")
    start = time.perf_counter()
    for name in engines:
        for i, posterior in enumerate(posteriors[name]):
            posterior.log_likelihoods([texts["rapidocr"][i], texts["easyocr"][i], truth[i]])
    three_ms = (time.perf_counter() - start) / (2 * n) * 1000
    print(f"three texts in one log_likelihoods call: {three_ms:.2f} ms")


if __name__ == "__main__":
    main()
