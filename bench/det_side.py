"""Can RapidOCR's text detector run at a smaller long side than its 2000 px cap without
losing words, and what does that save per page (issue 20: CPU cost per page)?

`RapidDetector` takes its long-side cap (`_max_side`, rapidocr's `max_side_len`, 2000) from
rapidocr's config, and `pipeline.tiles` plans the page's detection from it and from the
window budget (`_max_pixels`, `tiles.MAX_PIXELS`): a page up to twice the cap is detected
scaled down to the cap, whole or (over the budget) in full-width bands; a larger one in
windows at half size. This bench sets those attributes on the loaded detector (nothing in
ocrfleet changes)
and reads the same pages at each side through the one page path,
`pipeline.page.process_image`, with the default settings otherwise.

Sets (ground truth from `bench.corpus`), `--per-set` pages each, spread over the set:

- `tesseract_test`: realdocs/tesseract_test (two UNLV 300 dpi scans, eurotext, phototest);
  truth: each page's .txt;
- `olmocr`: olmOCR-bench sample pages that have `present` checks, rendered at the
  configured dpi and OCRed (their text layers are not used: a page read from its text
  layer runs no detector); truth: the text of those checks;
- `uw3`: UW-III line images (realdocs/uw3_500_ocropy), the widest ones, since a line no
  wider than the smallest side in `--sides` is detected at the same scale at every side;
  truth: each line's .gt.txt;
- `receipts`: SROIE receipts; truth: their box transcripts.

Each side runs in its own child process (this script with `--child SIDE`) that loads the
toolkit once, reads a warm-up page, then reads the pages the parent sends it; the parent
sends each page to every side in turn, the order of the sides rotating from page to page,
so a slow spell on a shared machine hits all sides. Only one child works at a time. Per
page a child reports the detector time (wall time inside the text-line detector's `detect`,
including the orientation check's calls), the pixels the detection model was given (its
input tensors after rapidocr's own resizing: a measure of the detector's work that a busy
machine does not blur), the page time (`process_image`), the page's text (the final text of
its regions in reading order, one per line), and its detection plan; at the end its peak
RSS (`ru_maxrss`: model loading included) and the peak it had after loading and the warm-up
page.

    python bench/det_side.py [--sides 2000,1600,1280] [--per-set 6]
    python bench/det_side.py --sides 2000/inf,2000/1.7   # whole pages against bands
    python bench/det_side.py --sides 2000+fp32,2000+int8 --per-set 10   # the detector's weights
                             [--sets tesseract_test,olmocr,uw3,receipts]

A side `SIDE[/MPX][@HEIGHT][+PRECISION]` also sets the text height the detector reads a page
for (`OCRFLEET_DET_TEXT_HEIGHT`: 0, every page at the detector's own scale; unset: the
default) and picks its weights (`OCRFLEET_DET_PRECISION`: int8 or fp32; unset: the default).

    python bench/det_side.py --sides 2000@0,2000 --sets receipts,olmocr,tesseract_test \
                             --per-set 20   # the survey's scale against the detector's own

Prints one line per page and side, then a table per set and side: word recall (hits/words
summed over the set), detector input megapixels, detector seconds, page seconds, peak RSS,
and their ratios against the first side in `--sides` (2000).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import (  # noqa: E402
    OLMOCR,
    REALDOCS,
    olmocr_truth,
    receipt_images,
    receipt_truth,
    word_recall,
)

SETS = ("tesseract_test", "olmocr", "uw3", "receipts")


@dataclass(frozen=True)
class Page:
    set: str
    path: str
    number: int  # 1-based page of the file
    truth: str

    @property
    def name(self) -> str:
        return f"{Path(self.path).name}#{self.number}"


def spread(items: list[Any], count: int) -> list[Any]:
    """`count` items spread evenly over `items`."""
    step = max(1.0, len(items) / max(1, count))
    return [items[int(i * step)] for i in range(min(count, len(items)))]


def sample(name: str, count: int) -> list[Page]:
    if name == "tesseract_test":
        tifs = spread(sorted((REALDOCS / "tesseract_test").glob("*.tif")), count)
        return [Page(name, str(p), 1, p.with_suffix(".txt").read_text()) for p in tifs]
    if name == "olmocr":
        truth = olmocr_truth()
        keys = spread(sorted(truth), count)
        return [Page(name, str(OLMOCR / "pdfs" / pdf), n, truth[(pdf, n)]) for pdf, n in keys]
    if name == "uw3":
        lines = sorted((REALDOCS / "uw3_500_ocropy" / "book").rglob("*.bin.png"))
        widest = sorted(lines, key=lambda p: (-Image.open(p).width, str(p)))[:count]
        return [
            Page(name, str(p), 1, p.with_name(p.name.replace(".bin.png", ".gt.txt")).read_text())
            for p in widest
        ]
    if name == "receipts":
        return [Page(name, str(p), 1, receipt_truth(p)) for p in receipt_images(count)]
    raise SystemExit(f"unknown set {name!r}; known: {', '.join(SETS)}")


# --- child: one side, pages from stdin, results to stdout ---------------------------------


def child(spec: str) -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr, not into the protocol

    from ocrfleet.config import Settings
    from ocrfleet.pipeline import page as page_path
    from ocrfleet.pipeline import split
    from ocrfleet.toolkit import load_toolkit

    spec, _, precision = spec.partition("+")
    settings = Settings(**({"det_precision": precision} if precision else {}))
    toolkit = load_toolkit(settings)
    lines = toolkit.line_detector
    spec, _, text_height = spec.partition("@")
    side, _, window_mpx = spec.partition("/")
    lines._max_side = int(side)  # type: ignore[attr-defined]
    if text_height:
        lines._text_height = int(text_height)  # type: ignore[attr-defined]
    if window_mpx:
        lines._max_pixels = float(window_mpx) * 1e6  # type: ignore[attr-defined]
    spent = [0.0, 0, 0]  # detect seconds, detect calls, model input pixels

    def timed(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
                spent[1] += 1

        return wrapper

    lines.detect = timed(lines.detect)  # type: ignore[method-assign]
    run_model = lines._det.session  # type: ignore[attr-defined]

    def counted(batch: Any) -> Any:
        spent[2] += batch.shape[-2] * batch.shape[-1]
        return run_model(batch)

    # The page's own detector and its copy for windows at detection scale share the session.
    for model in (lines._det, lines._window_det):  # type: ignore[attr-defined]
        model.session = counted
    page_path.process_image(1, Image.new("RGB", (400, 200), "white"), toolkit)
    loaded_mb = _peak_mb()
    print(json.dumps({"ready": spec, "loaded_mb": loaded_mb}), file=out)
    for line in sys.stdin:
        request = json.loads(line)
        it = split.iter_pages_with_text(Path(request["path"]).read_bytes(), settings)
        for _ in range(request["number"]):
            image, _layer = next(it)
        spent[:] = [0.0, 0, 0]
        started = time.perf_counter()
        processed = page_path.process_image(1, image, toolkit)
        page_s = time.perf_counter() - started
        result = processed.result
        text = "\n".join(result.region_text(r.number) for r in result.regions)
        plan = lines.last_plan  # type: ignore[attr-defined]
        reply = {
            "det_s": spent[0],
            "det_calls": spent[1],
            "det_mpx": spent[2] / 1e6,
            "page_s": page_s,
            "text": text,
            "size": list(processed.image.size),
            "plan": f"{plan.method} x{plan.scale:.3f} w{plan.windows}",
        }
        print(json.dumps(reply), file=out)
    print(json.dumps({"peak_mb": _peak_mb(), "loaded_mb": loaded_mb}), file=out)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# --- parent --------------------------------------------------------------------------------


class Side:
    def __init__(self, side: str) -> None:
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(side)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.loaded_mb = self._read()["loaded_mb"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"side {self.side}: child exited ({self.proc.wait()})")
        return json.loads(line)

    def read(self, page: Page) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"path": page.path, "number": page.number}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        final = self._read()
        self.proc.wait()
        return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sides",
        default="2000,1600,1280",
        help="first one is the baseline; SIDE/MPX also sets the detection window's budget "
        "(megapixels at detection scale, `tiles.MAX_PIXELS`; inf: none); +int8 or +fp32 "
        "the detector's weights",
    )
    parser.add_argument("--per-set", type=int, default=6)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    sides = args.sides.split(",")
    pages = [p for name in args.sets.split(",") for p in sample(name, args.per_set)]
    started = time.perf_counter()
    children = {side: Side(side) for side in sides}
    print(
        f"{len(pages)} pages, sides {sides}; children loaded in "
        f"{time.perf_counter() - started:.0f} s"
    )
    # (set, side) -> [hits, words, det_s, page_s, det_mpx]
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0, 0.0])
    for index, page in enumerate(pages):
        k = index % len(sides)
        for side in sides[k:] + sides[:k]:
            reply = children[side].read(page)
            hits, words = word_recall(reply["text"], page.truth)
            row = totals[(page.set, side)]
            row[0] += hits
            row[1] += words
            row[2] += reply["det_s"]
            row[3] += reply["page_s"]
            row[4] += reply["det_mpx"]
            print(
                f"{page.set} {page.name} {reply['size'][0]}x{reply['size'][1]} side {side}: "
                f"{reply['plan']}, det {reply['det_s']:.2f} s ({reply['det_calls']} calls, "
                f"{reply['det_mpx']:.1f} Mpx), "
                f"page {reply['page_s']:.2f} s, recall {hits}/{words}",
                flush=True,
            )
    peaks = {side: child.close() for side, child in children.items()}
    print(f"\nwall {time.perf_counter() - started:.0f} s\n")
    _table(args.sets.split(","), sides, totals, peaks)


def _table(
    sets: list[str],
    sides: list[str],
    totals: dict[tuple[str, str], list[float]],
    peaks: dict[str, dict[str, Any]],
) -> None:
    base = sides[0]
    print(
        f"{'set':<15}{'side':>6}{'recall':>8}{'d recall':>10}{'det Mpx':>9}{'det s':>8}"
        f"{'page s':>8}{'Mpx/' + str(base):>10}{'det/' + str(base):>10}{'page/' + str(base):>11}"
    )
    for name in [*sets, "all"]:
        for side in sides:
            row = _row(totals, name, side, sets)
            ref = _row(totals, name, base, sets)
            recall, ref_recall = row[0] / max(1, row[1]), ref[0] / max(1, ref[1])
            print(
                f"{name:<15}{side:>6}{recall:>8.4f}{recall - ref_recall:>+10.4f}"
                f"{row[4]:>9.1f}{row[2]:>8.1f}{row[3]:>8.1f}{row[4] / max(1e-9, ref[4]):>10.2f}"
                f"{row[2] / max(1e-9, ref[2]):>10.2f}{row[3] / max(1e-9, ref[3]):>11.2f}"
            )
    print(f"\n{'side':>6}{'peak RSS MB':>13}{'after load MB':>15}{'peak/' + str(base):>11}")
    for side in sides:
        peak, loaded = peaks[side]["peak_mb"], peaks[side]["loaded_mb"]
        print(f"{side:>6}{peak:>13.0f}{loaded:>15.0f}{peak / peaks[base]['peak_mb']:>11.2f}")


def _row(
    totals: dict[tuple[str, str], list[float]], name: str, side: str, sets: list[str]
) -> list[float]:
    if name != "all":
        return totals[(name, side)]
    rows = [totals[(s, side)] for s in sets]
    return [sum(r[i] for r in rows) for i in range(5)]


if __name__ == "__main__":
    main()
