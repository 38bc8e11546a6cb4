"""How much of a real page `ocrfleet run` sends to review, and how much of what it accepts
is wrong: `python bench/review_share.py [--olmocr N]`.

Pages: the two UNLV scans and phototest of realdocs/tesseract_test (ground truth: the page
`.txt`) and the first N olmOCR-bench sample PDFs (no line ground truth). Each goes through
the same ingest + process_page as `ocrfleet run` (default settings: RapidOCR, the consensus
scorer with its shipped thresholds), on a throwaway SQLite database, and the results are
read back with `load_page_result`. An accepted region counts as wrong when its text, in
the labels' canonical form, is not found in the page's canonical ground truth (reading order
and line breaks do not matter for a substring test; a region that spans two ground-truth
lines counts as wrong, so this over-counts errors).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import REALDOCS  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.db.migrate import upgrade  # noqa: E402
from ocrfleet.db.persist import load_page_result  # noqa: E402
from ocrfleet.db.session import session_scope  # noqa: E402
from ocrfleet.labels import canonical  # noqa: E402
from ocrfleet.service import Context, ingest, process_page  # noqa: E402

UNLV_PAGES = ("8071_093.3B", "8087_054.3B", "phototest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--olmocr", type=int, default=21)
    args = parser.parse_args()
    sources = [(REALDOCS / "tesseract_test" / f"{name}.tif", "unlv") for name in UNLV_PAGES]
    pdfs = sorted((REALDOCS / "olmocr_bench_sample" / "pdfs").rglob("*.pdf"))[: args.olmocr]
    sources += [(pdf, "olmocr") for pdf in pdfs]
    totals: dict[str, list[int]] = {}  # set -> [regions, flagged, accepted, accepted wrong]
    reasons: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'r.db'}", store_url=f"file://{Path(tmp) / 's'}"
        )
        upgrade(settings.database_url)
        ctx = Context(settings)
        for path, set_name in sources:
            outcome = ingest(ctx, path.name, data=path.read_bytes())
            truth = None
            if set_name == "unlv":
                truth = canonical(path.with_suffix(".txt").read_text(encoding="utf-8"))
            for page_id in outcome.page_ids:
                process_page(ctx, page_id)
                with session_scope(settings.database_url) as session:
                    result = load_page_result(session, page_id)
                text_of = {(c.region_number, c.engine): c.text for c in result.candidates}
                row = totals.setdefault(set_name, [0, 0, 0, 0])
                for decision in result.decisions:
                    if decision.accepted and decision.chosen_engine is None:
                        continue  # a figure: no text to verify
                    row[0] += 1
                    if not decision.accepted:
                        row[1] += 1
                        reason = decision.flag_reason or "?"
                        reasons[reason] = reasons.get(reason, 0) + 1
                        continue
                    row[2] += 1
                    text = canonical(text_of[(decision.region_number, decision.chosen_engine)])
                    if truth is not None and text not in truth:
                        row[3] += 1
    for set_name, (regions, flagged, accepted, wrong) in totals.items():
        line = f"{set_name}: regions {regions}, flagged {flagged} ({flagged / regions:.3f})"
        if set_name == "unlv":
            share = wrong / accepted if accepted else 0.0
            line += f", accepted {accepted}, accepted wrong {wrong} ({share:.3f})"
        print(line)
    print(f"flag reasons: {dict(sorted(reasons.items()))}")


if __name__ == "__main__":
    main()
