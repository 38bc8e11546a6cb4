"""At what width should RapidOCR's recogniser read a crop (issue 20: CPU cost per page)?

The model reads a crop resized to 48 rows; whatever columns its input has beyond the crop
are padding. rapidocr pads every input to at least 320 columns and a batch to its widest
crop; ocrfleet read each crop padded to a width bucket (320 x 1.25**k, in steps of 32)
until it read each at its own width (`rapidocr.input_width`: whole CTC frames of 8
columns, at least `MIN_WIDTH`). This bench reads the same real crops under each policy:

- `receipts`: the ground-truth box crops of `--receipts` SROIE receipts spread over the set
  (`bench.corpus.receipt_images`), truth their transcripts;
- `uw3`: the 500 UW-III line images of realdocs/uw3_500_ocropy/book, truth their .gt.txt.

Policies: `bucket` (the width buckets above) and `own:N` (the crop's own width, at least N
columns; `own:96` is the shipped one), each optionally with `+PRECISION`, the recogniser's
weights (`OCRFLEET_REC_PRECISION`: `fp32`, the default, or `int8`). Each policy reads each
set `--rounds` times, the policies interleaved; the model time is the least over the rounds.

    python bench/rec_width.py [--policies own:96+fp32,own:96+int8] [--receipts 20]

Prints per set and policy: CER (edit distance over truth characters, case and runs of
whitespace folded: SROIE transcripts are often upper-cased), the crops read differently
from the first policy, seconds, and the time ratio against the first policy.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import REALDOCS, receipt_crops, receipt_images  # noqa: E402
from ocrfleet.engines import rapidocr  # noqa: E402
from ocrfleet.metrics import levenshtein  # noqa: E402

BUCKET_BASE, BUCKET_GROWTH, BUCKET_STEP = 320, 1.25, 32


def bucket(natural: int) -> int:
    """The width buckets ocrfleet read with before `input_width`."""
    width = BUCKET_BASE
    while width < natural:
        width = -(-math.ceil(width * BUCKET_GROWTH) // BUCKET_STEP) * BUCKET_STEP
    return width


def own(least: int) -> Callable[[int], int]:
    def width(natural: int) -> int:
        return max(least, -(-natural // rapidocr.WIDTH_STEP) * rapidocr.WIDTH_STEP)

    return width


def policy(name: str) -> tuple[Callable[[int], int], str]:
    """(input width per crop width, weights) of `bucket` or `own:N`, with `+PRECISION`."""
    width, _, precision = name.partition("+")
    if precision not in ("", *rapidocr.REC_MODELS):
        raise SystemExit(f"unknown precision in {name!r}: one of {sorted(rapidocr.REC_MODELS)}")
    precision = precision or "fp32"
    if width == "bucket":
        return bucket, precision
    if width.startswith("own:"):
        return own(int(width[4:])), precision
    raise SystemExit(f"unknown policy {name!r}: bucket or own:N, then +PRECISION")


def uw3_crops() -> tuple[list[Image.Image], list[str]]:
    lines = sorted((REALDOCS / "uw3_500_ocropy" / "book").glob("*/*.bin.png"))
    crops = [Image.open(p).convert("RGB") for p in lines]
    truths = [p.with_name(p.name.replace(".bin.png", ".gt.txt")).read_text() for p in lines]
    return crops, truths


def fold(text: str) -> str:
    return " ".join(text.lower().split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="own:96+fp32,own:96+int8,own:160+fp32")
    parser.add_argument("--receipts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    names = args.policies.split(",")
    policies = {name: policy(name) for name in names}
    sets = {"receipts": receipt_crops(receipt_images(args.receipts)), "uw3": uw3_crops()}
    recognisers = {
        precision: rapidocr.RapidRecogniser(rapidocr.REC_MODELS[precision])
        for precision in {precision for _, precision in policies.values()}
    }
    for recogniser in recognisers.values():  # first-call costs out of the numbers
        recogniser.recognise(sets["uw3"][0][:4])
    readings: dict[tuple[str, str], list[str]] = {}
    seconds: dict[tuple[str, str], float] = {}
    for number in range(args.rounds):
        for name in names[number % len(names) :] + names[: number % len(names)]:
            rapidocr.input_width, precision = policies[name]
            recogniser = recognisers[precision]
            for set_name, (crops, _) in sets.items():
                started = time.perf_counter()
                texts = [text for text, _ in recogniser.recognise(crops)]
                spent = time.perf_counter() - started
                key = (set_name, name)
                seconds[key] = min(spent, seconds.get(key, math.inf))
                readings[key] = texts
    for set_name, (crops, truths) in sets.items():
        chars = sum(len(fold(t)) for t in truths)
        print(f"{set_name} ({len(crops)} crops, {chars} characters):")
        first = (set_name, names[0])
        for name in names:
            key = (set_name, name)
            pairs = zip(readings[key], truths, strict=True)
            edits = sum(levenshtein(fold(read), fold(truth)) for read, truth in pairs)
            changed = sum(a != b for a, b in zip(readings[key], readings[first], strict=True))
            print(
                f"  {name:>8}: CER {edits / chars:.4f}, {changed} read differently from "
                f"{names[0]}, {seconds[key]:.1f} s ({seconds[key] / seconds[first]:.2f}x)"
            )


if __name__ == "__main__":
    main()
