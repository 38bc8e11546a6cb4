"""Quality of `ocrfleet run` on real third-party documents.

1. tesseract_test/ (UNLV scans, eurotext, phototest): page character error rate against the
   ground-truth `.txt`, whitespace folded (reading-order differences count as errors).
2. olmocr_bench_sample/pdfs: the share of `present` checks of `dataset.jsonl` that pass
   (the snippet occurs in the page's normalised text, within `max_diffs` edits).

Runs the real CLI (`ocrfleet run`) on a throwaway SQLite database and store, then reads the
text back through the `document_text_lines` view.

    python bench/realdocs_quality.py [--realdocs ../shared/data/realdocs]
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


def within_edits(needle: str, haystack: str, max_diffs: int) -> bool:
    """Approximate substring match (Sellers): some substring is within max_diffs edits."""
    if max_diffs == 0 or not needle:
        return needle in haystack
    previous = list(range(len(needle) + 1))
    for char in haystack:
        current = [0]
        for j, nch in enumerate(needle, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (nch != char))
            )
        if current[-1] <= max_diffs:
            return True
        previous = current
    return False


def run_cli(inputs: list[Path], workdir: Path) -> str:
    db_url = f"sqlite:///{workdir / 'bench.db'}"
    env = {
        **os.environ,
        "OCRFLEET_DATABASE_URL": db_url,
        "OCRFLEET_STORE_URL": f"file://{workdir / 'store'}",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realdocs", type=Path, default=REALDOCS)
    args = parser.parse_args()
    tess = args.realdocs / "tesseract_test"
    olm = args.realdocs / "olmocr_bench_sample"
    checks = [
        json.loads(line)
        for line in (olm / "dataset.jsonl").read_text().splitlines()
        if line.strip() and json.loads(line)["type"] == "present"
    ]
    tifs = sorted(tess.glob("*.tif"))
    pdfs = sorted({olm / "pdfs" / c["pdf"] for c in checks})

    with tempfile.TemporaryDirectory() as tmp:
        texts = page_texts(run_cli(tifs + pdfs, Path(tmp)))

    total_err = total_len = 0.0
    for tif in tifs:
        reference = normalize_ws(tif.with_suffix(".txt").read_text())
        hypothesis = normalize_ws(texts.get((tif.name, 1), ""))
        page_cer = cer(hypothesis, reference)
        total_err += page_cer * len(reference)
        total_len += len(reference)
        print(f"cer {tif.name}: {page_cer:.4f}")
    print(f"cer tesseract_test (character-weighted): {total_err / total_len:.4f}")

    passed = 0
    for check in checks:
        page = normalise(texts.get((check["pdf"], check.get("page", 1)), ""))
        needle = normalise(check["text"])
        if not check.get("case_sensitive", True):
            page, needle = page.lower(), needle.lower()
        ok = within_edits(needle, page, int(check.get("max_diffs", 0)))
        passed += ok
        print(f"present {check['id']}: {'pass' if ok else 'FAIL'}")
    print(f"olmocr present checks passed: {passed}/{len(checks)} = {passed / len(checks):.3f}")


if __name__ == "__main__":
    main()
