"""Where a page's CPU time goes, per stage and per kind of page: the profile that says which
lever is worth pulling.

Kinds: `receipts` (SROIE scans), `scans` (the two UNLV pages of realdocs/tesseract_test),
`clean` (phototest, eurotext), `pdf-text` (olmOCR-bench sample pages with a text layer) and
`pdf-scan` (its pages without one). Every page goes through the one page path,
`pipeline.page.process_image`, with the default settings, in this process; the stages are
timed by wrapping what the page path calls (nothing in ocrfleet is changed), each stage's
time exclusive of the stages it calls:

- render: the split (PDF rendering, image decoding, a PDF page's text layer);
- text layer: judging a PDF page's own text;
- orientation: `upright` (its classifier and its check, less the line detection and
  recognition it asks for);
- layout model, line detection, recognition (the primary engine, batched), verifier (the
  scorer with its re-reads, less nothing: re-reads by its readers count here);
- other: decide, region ordering, crops, the rest of the page path.

The verifier's time is also split by who spends it: each re-reader's calls made inside the
verifier (`re-read tesseract`, `re-read easyocr`, `re-read rapidocr`: its posterior pass) are
printed as their own stages, and `verifier` keeps the rest (features, the trees).

Model inference (the RapidOCR detector's and recogniser's runtime calls, inside line
detection, recognition and the verifier's re-reads) is printed as its own share too.

    python bench/profile_stages.py [--per-kind 3] [--kinds receipts,scans,clean,pdf-text]

Prints one line per page, then per kind and overall the share of each stage; the last line
reads `overall: render X.XX ... other X.XX; inference X.XX`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import OLMOCR, REALDOCS, receipt_images  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.pipeline import page as page_path  # noqa: E402
from ocrfleet.pipeline import split, textlayer  # noqa: E402
from ocrfleet.toolkit import Toolkit, load_toolkit  # noqa: E402

STAGES = (
    "render",
    "text layer",
    "orientation",
    "layout model",
    "line detection",
    "recognition",
    "verifier",
    "re-read rapidocr",
    "re-read tesseract",
    "re-read easyocr",
    "other",
)
KINDS = ("receipts", "scans", "clean", "pdf-text", "pdf-scan")


class Profile:
    """Exclusive time per stage: a call inside a timed call is taken off its caller."""

    def __init__(self) -> None:
        self.times: Counter[str] = Counter()
        self.cpu: Counter[str] = Counter()  # CPU seconds, this process's and its children's
        self.inference = 0.0
        self._stack: list[list[Any]] = []

    def wrap(
        self, stage: str, fn: Callable[..., Any], inside: str | None = None
    ) -> Callable[..., Any]:
        """`fn` timed as `stage`; with `inside`, only when called directly by that stage."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if inside is not None and (not self._stack or self._stack[-1][0] != inside):
                return fn(*args, **kwargs)
            frame = [stage, 0.0, 0.0]  # stage, wall and CPU time spent in the calls it made
            self._stack.append(frame)
            started, cpu_started = time.perf_counter(), cpu_seconds()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                cpu = cpu_seconds() - cpu_started
                self._stack.pop()
                self.times[stage] += spent - frame[1]
                self.cpu[stage] += cpu - frame[2]
                if self._stack:
                    self._stack[-1][1] += spent
                    self._stack[-1][2] += cpu

        return timed

    def count_inference(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inference += time.perf_counter() - started

        return timed


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its children that have ended (the
    tesseract processes a re-read waits for)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def instrument(toolkit: Toolkit, profile: Profile) -> None:
    """Wrap the calls the page path makes (instance attributes and module names)."""
    page_path.upright = profile.wrap("orientation", page_path.upright)
    textlayer.judge = profile.wrap("text layer", textlayer.judge)
    detector, lines = toolkit.detector, toolkit.line_detector
    if hasattr(detector, "blocks"):
        detector.blocks = profile.wrap("layout model", detector.blocks)  # type: ignore[attr-defined]
    lines.detect = profile.wrap("line detection", lines.detect)  # type: ignore[method-assign]
    det = getattr(lines, "_det", None)
    if det is not None:
        det.session = profile.count_inference(det.session)
    for rec in toolkit.recognisers[:1]:
        for name in ("recognise", "recognise_words"):
            if hasattr(rec, name):
                setattr(rec, name, profile.wrap("recognition", getattr(rec, name)))
        inner = getattr(rec, "_rec", None)
        if inner is not None:
            inner.session = profile.count_inference(inner.session)
    for name in ("score", "score_against"):  # the page path calls the latter where it exists
        if hasattr(toolkit.scorer, name):
            setattr(toolkit.scorer, name, profile.wrap("verifier", getattr(toolkit.scorer, name)))
    features = getattr(toolkit.scorer, "features", None)
    for reader in getattr(features, "readers", ()):
        stage = f"re-read {reader.name}"
        if stage not in STAGES:
            continue
        for name in ("recognise", "recognise_words", "posteriors"):
            if hasattr(reader, name):
                wrapped = profile.wrap(stage, getattr(reader, name), inside="verifier")
                setattr(reader, name, wrapped)


def sources(kind: str, count: int) -> list[Path]:
    tess = REALDOCS / "tesseract_test"
    if kind == "receipts":
        return receipt_images(count)
    if kind == "scans":
        return sorted(tess.glob("8*.tif"))[:count]
    if kind == "clean":
        return [tess / "phototest.tif", tess / "eurotext.tif"][:count]
    return sorted((OLMOCR / "pdfs").rglob("*.pdf"))


def pages(kind: str, count: int, settings: Settings, profile: Profile) -> Iterator[tuple]:
    """(name, image, text layer) of `count` pages of `kind`, rendered under the profile."""
    render = profile.wrap("render", lambda it: next(it, None))
    found = 0
    for path in sources(kind, count):
        it = split.iter_pages_with_text(path.read_bytes(), settings)
        number = 0
        while (item := render(it)) is not None:
            image, layer = item
            number += 1
            if kind.startswith("pdf") and (layer is not None) != (kind == "pdf-text"):
                continue
            yield f"{path.name}#{number}", image, layer
            found += 1
            if found == count:
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=3)
    parser.add_argument("--kinds", default="receipts,scans,clean,pdf-text,pdf-scan")
    args = parser.parse_args()
    settings = Settings()
    toolkit = load_toolkit(settings)
    profile = Profile()
    instrument(toolkit, profile)
    warm = Image.new("RGB", (400, 200), "white")
    page_path.process_image(1, warm, toolkit)  # first-call costs out of the numbers
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    cpu_by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    inference: Counter[str] = Counter()
    for kind in args.kinds.split(","):
        if kind not in KINDS:
            raise SystemExit(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
        profile.times.clear()
        profile.cpu.clear()
        profile.inference = 0.0
        started, cpu_started = time.perf_counter(), cpu_seconds()
        for name, image, layer in pages(kind, args.per_kind, settings, profile):
            before, page_started = Counter(profile.times), time.perf_counter()
            processed = page_path.process_image(1, image, toolkit, layer)
            spent = time.perf_counter() - page_started
            stages = profile.times - before
            print(
                f"{kind} {name}: {spent:.2f} s, {len(processed.result.regions)} regions, "
                + ", ".join(f"{s} {stages[s]:.2f}" for s in STAGES if stages[s])
            )
        total = time.perf_counter() - started
        profile.times["other"] += total - sum(profile.times.values())
        profile.cpu["other"] += cpu_seconds() - cpu_started - sum(profile.cpu.values())
        by_kind[kind] = Counter(profile.times)
        cpu_by_kind[kind] = Counter(profile.cpu)
        inference[kind] = profile.inference
        _share(kind, by_kind[kind], cpu_by_kind[kind], inference[kind])
    overall = sum(by_kind.values(), Counter())
    _share("overall", overall, sum(cpu_by_kind.values(), Counter()), sum(inference.values()))


def _share(label: str, times: Counter[str], cpu: Counter[str], inference: float) -> None:
    """The stages' shares of wall time, then the cores each kept busy (CPU over wall time:
    below the cores available, a stage leaves them idle)."""
    total = sum(times.values()) or 1.0
    parts = " ".join(f"{stage} {times[stage] / total:.2f}" for stage in STAGES)
    print(f"{label}: {parts}; inference {inference / total:.2f} ({total:.1f} s)")
    cores = " ".join(
        f"{stage} {cpu[stage] / times[stage]:.2f}" for stage in STAGES if times[stage] > 0.01
    )
    print(f"{label} cores: {cores}; all {sum(cpu.values()) / total:.2f}")


if __name__ == "__main__":
    main()
