"""Quality of `ocrfleet run` on real third-party documents.

1. tesseract_test/ (UNLV scans, eurotext, phototest): page character error rate against the
   ground-truth `.txt`, whitespace folded (reading-order differences count as errors).
2. olmocr_bench_sample/pdfs: the share of `present` checks of `dataset.jsonl` that pass
   (the snippet occurs in the page's normalised text, within `max_diffs` edits), and of
   `order` checks (the `before` snippet starts before the `after` one, olmOCR-bench style).
3. Layout categories: tables and formulas found per page, and whether every page that the
   sample's `table` checks name has a `table` region.

Each is measured for every detector named (`OCRFLEET_LAYOUT`), by default `lines` (before
layout) and `rapid` (layout blocks), in one run. Runs the real CLI (`ocrfleet run`) on a
throwaway SQLite database and store per detector, then reads the text back through the
`document_text_lines` view.

    python bench/realdocs_quality.py [--realdocs ../shared/data/realdocs] [--layouts lines,rapid]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import REALDOCS  # noqa: E402
from ocrfleet.metrics import cer, normalize_ws  # noqa: E402

QUOTES = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "ﬁ": "fi"})


def normalise(value: str) -> str:
    """olmOCR-bench style: NFC, unified quotes and dashes, folded whitespace."""
    value = unicodedata.normalize("NFKC", value).translate(QUOTES)
    return re.sub(r"\s+", " ", value).strip()


def match_ends(needle: str, haystack: str, max_diffs: int) -> list[int]:
    """End offsets in `haystack` of substrings within max_diffs edits of `needle` (Sellers)."""
    if max_diffs == 0 or not needle:
        ends, start = [], haystack.find(needle)
        while start >= 0:
            ends.append(start + len(needle))
            start = haystack.find(needle, start + 1)
        return ends
    ends = []
    previous = list(range(len(needle) + 1))
    for offset, char in enumerate(haystack, start=1):
        current = [0]
        for j, nch in enumerate(needle, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (nch != char))
            )
        if current[-1] <= max_diffs:
            ends.append(offset)
        previous = current
    return ends


def within_edits(needle: str, haystack: str, max_diffs: int) -> bool:
    """Approximate substring match: some substring is within max_diffs edits."""
    return bool(match_ends(needle, haystack, max_diffs))


def in_order(before: str, after: str, haystack: str, max_diffs: int) -> bool:
    """olmOCR-bench's order check: some match of `before` starts before some of `after`."""
    firsts = match_ends(before, haystack, max_diffs)
    lasts = match_ends(after, haystack, max_diffs)
    if not firsts or not lasts:
        return False
    return min(end - len(before) for end in firsts) < max(end - len(after) for end in lasts)


def run_cli(inputs: list[Path], workdir: Path, layout: str) -> str:
    db_url = f"sqlite:///{workdir / 'bench.db'}"
    env = {
        **os.environ,
        "OCRFLEET_DATABASE_URL": db_url,
        "OCRFLEET_STORE_URL": f"file://{workdir / 'store'}",
        "OCRFLEET_LAYOUT": layout,
        "OMP_THREAD_LIMIT": "1",
    }
    cmd = [sys.executable, "-m", "ocrfleet.cli", "run", "--json", *map(str, inputs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"ocrfleet run failed ({done.returncode}):\n{done.stderr}")
    return db_url


def page_texts(db_url: str) -> dict[tuple[str, int], str]:
    """(input file name, page number) → the page's text in reading order."""
    engine = create_engine(db_url)
    lines: dict[tuple[str, int], list[str]] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT d.source_uri, l.page_number, l.text FROM document_text_lines l "
                "JOIN documents d ON d.id = l.document_id "
                "ORDER BY d.id, l.page_number, l.region_number"
            )
        )
        for source_uri, page_number, line in rows:
            lines.setdefault((Path(source_uri).name, page_number), []).append(line or "")
    engine.dispose()
    return {key: "\n".join(value) for key, value in lines.items()}


def page_categories(db_url: str) -> dict[tuple[str, int], dict[str, int]]:
    """(input file name, page number) → how many regions of each category it has."""
    engine = create_engine(db_url)
    counts: dict[tuple[str, int], dict[str, int]] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT d.source_uri, p.number, r.category, count(*) FROM regions r "
                "JOIN pages p ON p.id = r.page_id JOIN documents d ON d.id = p.document_id "
                "GROUP BY d.source_uri, p.number, r.category"
            )
        )
        for source_uri, page_number, category, n in rows:
            counts.setdefault((Path(source_uri).name, page_number), {})[category] = n
    engine.dispose()
    return counts


def measure(layout: str, tifs: list[Path], pdfs: list[Path], checks: list[dict]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        db_url = run_cli(tifs + pdfs, Path(tmp), layout)
        texts, categories = page_texts(db_url), page_categories(db_url)

    total_err = total_len = 0.0
    for tif in tifs:
        reference = normalize_ws(tif.with_suffix(".txt").read_text())
        hypothesis = normalize_ws(texts.get((tif.name, 1), ""))
        page_cer = cer(hypothesis, reference)
        total_err += page_cer * len(reference)
        total_len += len(reference)
        print(f"[{layout}] cer {tif.name}: {page_cer:.4f}")
    results = {"cer": total_err / total_len}

    for kind in ("present", "order"):
        passed = 0
        own = [c for c in checks if c["type"] == kind]
        for check in own:
            page = normalise(texts.get((Path(check["pdf"]).name, check.get("page", 1)), ""))
            snippets = [check["text"]] if kind == "present" else [check["before"], check["after"]]
            snippets = [normalise(snippet) for snippet in snippets]
            if not check.get("case_sensitive", True):
                page, snippets = page.lower(), [snippet.lower() for snippet in snippets]
            diffs = int(check.get("max_diffs") or 0)
            if kind == "present":
                ok = within_edits(snippets[0], page, diffs)
            else:
                ok = in_order(snippets[0], snippets[1], page, diffs)
            passed += ok
            print(f"[{layout}] {kind} {check['id']}: {'pass' if ok else 'FAIL'}")
        results[kind] = (passed, len(own))

    table_pages = sorted({Path(c["pdf"]).name for c in checks if c["type"] == "table"})
    results["table_pages"] = [(p, categories.get((p, 1), {}).get("table", 0)) for p in table_pages]
    unlv = [t.name for t in tifs if t.name[0].isdigit()]
    for group, names in (("unlv", unlv), ("olmocr", [p.name for p in pdfs])):
        found = [categories.get((name, 1), {}) for name in names]
        results[group] = {k: sum(c.get(k, 0) for c in found) for k in ("table", "formula")}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realdocs", type=Path, default=REALDOCS)
    parser.add_argument("--layouts", default="lines,rapid", help="OCRFLEET_LAYOUT values")
    args = parser.parse_args()
    tess = args.realdocs / "tesseract_test"
    olm = args.realdocs / "olmocr_bench_sample"
    lines = (olm / "dataset.jsonl").read_text().splitlines()
    checks = [json.loads(line) for line in lines if line.strip()]
    tifs = sorted(tess.glob("*.tif"))
    pdfs = sorted({olm / "pdfs" / c["pdf"] for c in checks})

    layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
    results = {layout: measure(layout, tifs, pdfs, checks) for layout in layouts}
    print()
    for layout, r in results.items():
        (p_ok, p_n), (o_ok, o_n) = r["present"], r["order"]
        print(
            f"layout={layout}: olmocr present {p_ok}/{p_n} = {p_ok / p_n:.3f}, "
            f"order {o_ok}/{o_n} = {o_ok / o_n:.3f}, tesseract_test cer {r['cer']:.4f}"
        )
        print(
            f"layout={layout}: tables/formulas found: UNLV {r['unlv']['table']}/"
            f"{r['unlv']['formula']}, olmocr sample {r['olmocr']['table']}/"
            f"{r['olmocr']['formula']}; table regions on pages the table checks name: "
            + ", ".join(f"{page} {n}" for page, n in r["table_pages"])
        )


if __name__ == "__main__":
    main()
