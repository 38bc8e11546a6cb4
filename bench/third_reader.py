"""What the consensus scorer's re-readers cost on real pages, and how often the third reader
(EasyOCR, read last and only where its reading could change the decision) is asked:

    python bench/third_reader.py [--pages 6]

Runs the page path of `ocrfleet run` (`pipeline.page.process_png`: orientation,
detection, recognition by the configured engines, scoring against the scorer's policy) on
the first real pages of bench/corpus.py, timing every re-reader's model calls inside
scoring. Prints per page the units, their verdicts and the crops each re-reader read;
the last lines read `re-reader share of page time: tesseract X.XX easyocr X.XX ...` and
`third reader asked for X of Y units scored`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import real_pages  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.pipeline.page import process_png  # noqa: E402
from ocrfleet.toolkit import load_toolkit  # noqa: E402


class _Timed:
    """A re-reader's model calls, timed and counted (crops asked for)."""

    def __init__(self, reader) -> None:
        self.reader, self.name, self.version = reader, reader.name, reader.version
        self.seconds, self.crops = 0.0, 0
        for method in ("recognise", "recognise_words", "posteriors"):
            if callable(getattr(reader, method, None)):
                setattr(self, method, self._timed(getattr(reader, method)))

    def _timed(self, call):
        def timed(crops):
            started = time.perf_counter()
            try:
                return call(crops)
            finally:
                self.seconds += time.perf_counter() - started
                self.crops += len(crops)

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=6)
    args = parser.parse_args()
    settings = Settings()
    toolkit = load_toolkit(settings)
    readers = [_Timed(r) for r in toolkit.scorer.features.readers]
    toolkit.scorer.features.readers = readers
    total = 0.0
    verdicts: Counter[str] = Counter()
    for number, data in enumerate(real_pages(settings, args.pages), start=1):
        before = {r.name: r.crops for r in readers}
        started = time.perf_counter()
        scores = process_png(number, data, toolkit).result.scores
        total += time.perf_counter() - started
        counts = Counter(str(getattr(s.verdict, "value", s.verdict)) for s in scores)
        verdicts += counts
        read = ", ".join(f"{r.name} {r.crops - before[r.name]}" for r in readers)
        print(f"page {number}: {len(scores)} units {dict(counts)}; crops read: {read}")
    shares = " ".join(f"{r.name} {r.seconds / total:.2f}" for r in readers)
    print(f"page time {total:.1f} s; verdicts {dict(verdicts)}")
    print(f"re-reader share of page time: {shares}")
    third = next((r for r in readers if r.name == "easyocr"), None)
    if third is not None:
        print(f"third reader asked for {third.crops} of {sum(verdicts.values())} units scored")


if __name__ == "__main__":
    main()
