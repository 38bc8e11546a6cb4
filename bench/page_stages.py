"""Where a page's time goes: orientation, detection, recognition, scoring (the stages of
`pipeline.page.process_image`), against RapidOCR's own pipeline on the same page in the
same process.

    python bench/page_stages.py [--pages 6]

Prints one line per page and the totals; the last line reads
`share of page time: orient X.XX detect X.XX recognise X.XX score X.XX`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import real_pages  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.pipeline.images import load_image  # noqa: E402
from ocrfleet.pipeline.orient import upright  # noqa: E402
from ocrfleet.pipeline.recognise import recognise  # noqa: E402
from ocrfleet.pipeline.regions import detect_regions  # noqa: E402
from ocrfleet.pipeline.review import score_units  # noqa: E402
from ocrfleet.scorers import load_policy  # noqa: E402
from ocrfleet.toolkit import load_toolkit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=6)
    args = parser.parse_args()
    from rapidocr import RapidOCR

    settings = Settings()
    toolkit = load_toolkit(settings)
    policy = load_policy(settings)
    bare = RapidOCR()
    totals = np.zeros(5)
    units = bounded = 0
    for number, data in enumerate(real_pages(settings, args.pages), start=1):
        page = load_image(data)
        started = time.perf_counter()
        bare(np.asarray(page))
        marks = [time.perf_counter()]
        page, _ = upright(
            page,
            toolkit.orienter,
            settings.orientation_min_confidence,
            toolkit.line_detector,
            toolkit.recognisers[0],
        )
        marks.append(time.perf_counter())
        regions = detect_regions(page, toolkit.detector)
        marks.append(time.perf_counter())
        candidates = recognise(page, regions, toolkit.recognisers)
        marks.append(time.perf_counter())
        scores = score_units(page, regions, candidates, toolkit.scorer, policy)
        marks.append(time.perf_counter())
        times = np.diff([started, *marks])
        units += len(scores)
        bounded += sum(score.verdict == "bounded" for score in scores)
        totals += times
        print(
            f"page {number}: {len(regions)} regions, bare {times[0]:.2f} s, orient "
            f"{times[1]:.2f} s, detect {times[2]:.2f} s, recognise {times[3]:.2f} s, score "
            f"{times[4]:.2f} s"
        )
    ours = totals[1:].sum()
    print(f"bare rapidocr: {totals[0]:.1f} s; ocrfleet stages: {ours:.1f} s")
    print(f"units scored: {units}, bounded without a re-read: {bounded}")
    print(
        f"share of page time: orient {totals[1] / ours:.2f} detect {totals[2] / ours:.2f} "
        f"recognise {totals[3] / ours:.2f} score {totals[4] / ours:.2f}"
    )


if __name__ == "__main__":
    main()
