"""bench/realrows.py's cache: readings are kept by crop and labels applied at load, so an
audited label changes training rows without any engine reading again."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench import label_audit, realrows
from tests.conftest import REALDOCS, REPO

BOOK = REALDOCS / "uw3_500_ocropy" / "book"
HEADER = "set,document,line,original,corrected,reason\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A realrows cache and a corrections file of the test's own."""
    monkeypatch.setattr(realrows, "OUT", tmp_path / "realrows")
    monkeypatch.setattr(label_audit, "CORRECTIONS", tmp_path / "corrections.csv")
    (tmp_path / "corrections.csv").write_text(HEADER)
    label_audit.corrections.cache_clear()
    yield tmp_path / "realrows"
    label_audit.corrections.cache_clear()


def _book_line() -> tuple[Path, str]:
    if not BOOK.is_dir():
        pytest.skip(f"no UW3 book lines under {BOOK}")
    png = sorted(BOOK.glob("*/*.bin.png"))[0]
    return png, png.with_name(png.name.replace(".bin.png", ".gt.txt")).read_text().strip()


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _record(png: Path, truth: str, **extra) -> dict:
    stem = png.name.split(".")[0]
    return {
        "set": "uw3", "doc": png.parent.name, "id": f"{png.parent.name}/{stem}",
        "source": "gt", "image": str(png), "bbox": None, "truth": truth, "line": stem,
        "case_sensitive": True, "reads": {"rapidocr@v1": [truth, 0.99, 0.98]}, **extra,
    }  # fmt: skip


def test_a_correction_relabels_a_cached_row_and_a_stale_one_is_an_error(cache: Path) -> None:
    png, truth = _book_line()
    _write(realrows.cache_path("uw3"), [_record(png, truth)])
    (row,) = realrows.load_rows("uw3")
    assert row.truth == truth and row.reads["rapidocr"][0] == truth
    stem = png.name.split(".")[0]
    label_audit.CORRECTIONS.write_text(
        HEADER + f'uw3,{png.parent.name},{stem},"{truth}",corrected text,test\n'
    )
    label_audit.corrections.cache_clear()
    (row,) = realrows.load_rows("uw3")
    assert row.truth == "corrected text"  # the label moved; the reading is the cached one
    assert row.reads["rapidocr"][0] == truth
    label_audit.CORRECTIONS.write_text(
        HEADER + f"uw3,{png.parent.name},{stem},not the annotation,corrected text,test\n"
    )
    label_audit.corrections.cache_clear()
    with pytest.raises(label_audit.StaleCorrection):
        realrows.load_rows("uw3")


def test_rows_cached_without_their_line_identity_say_what_to_run(cache: Path) -> None:
    png, truth = _book_line()
    record = _record(png, truth)
    del record["line"]
    _write(realrows.cache_path("uw3"), [record])
    with pytest.raises(ValueError, match="run `python bench/realrows.py --sets uw3`"):
        realrows.load_rows("uw3")


def test_ctc_evidence_is_found_by_crop_and_a_missing_text_says_what_to_run(cache: Path) -> None:
    png, truth = _book_line()
    _write(realrows.cache_path("uw3"), [_record(png, truth)])
    with pytest.raises(ValueError, match="no CTC evidence; run"):
        realrows.load_rows("uw3", ctc=True)
    (row,) = realrows.load_rows("uw3")
    model = {"text": truth, "evidence": [0.9, 0.8, -0.1], "ll": {truth: -1.5}}
    _write(
        realrows.ctc_path("uw3"),
        [{"crop": realrows.crop_id(row), "id": row.id,
          "reads": {"easyocr@v2": [truth, 0.7, None]}, "models": {"easyocr@v2": model}}],
    )  # fmt: skip
    (row,) = realrows.load_rows("uw3", ctc=True)
    assert row.reads["easyocr"] == (truth, 0.7, None)
    scores = row.ctc["easyocr"].scores()
    assert scores.log_likelihood(truth) == -1.5 and scores.min_char_prob == 0.9
    with pytest.raises(KeyError, match="run `python bench/realrows.py --ctc`"):
        scores.log_likelihood("another text")


def test_a_pdf_text_layer_gives_one_row_per_line_on_the_page_production_renders(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from ocrfleet.config import Settings
    from ocrfleet.pipeline import textlayer
    from ocrfleet.pipeline.split import iter_pages_with_text

    letter = REPO / "examples" / "letter.pdf"
    packed = tmp_path / "letter.pdf.gz"
    packed.write_bytes(gzip.compress(letter.read_bytes()))
    monkeypatch.setattr(
        realrows, "DEBIAN_MANUALS", (str(tmp_path / "missing.pdf"), str(letter), str(packed))
    )
    monkeypatch.setattr(realrows, "PDF_PAGES", 1)  # the middle page
    docs = list(realrows.pdf_docs(Settings()))
    assert "missing.pdf is missing" in capsys.readouterr().err
    assert [doc for doc, _ in docs] == ["examples", tmp_path.name]
    pages = list(iter_pages_with_text(letter.read_bytes(), Settings()))
    middle = len(pages) // 2
    regions, candidates = textlayer.reading(pages[middle][1])
    for _, rows in docs:  # the gzipped manual reads as the plain one
        assert [row.truth for row in rows] == [c.text for c in candidates]
        assert {row.source for row in rows} == {"layer"} and all(r.case_sensitive for r in rows)
        for row, region in zip(rows, regions, strict=True):
            b = region.bbox
            assert row.crop().size == (b.x1 - b.x0, b.y1 - b.y0)
    assert docs[0][1][0].image == str(cache / "pdf" / f"examples-p{middle + 1}.png")


def test_a_receipt_crop_is_true_to_what_it_shows_not_to_punctuation_beyond_it() -> None:
    # 29 characters over 290 px: 10 px each; the colon's place is x = 380-390.
    text, box = "TOTAL SALES (EXCLUDING GST) :", (100, 10, 390, 30)
    assert realrows.visible_truth(text, box, (95, 8, 375, 32)) == "TOTAL SALES (EXCLUDING GST)"
    assert realrows.visible_truth(text, box, (95, 8, 388, 32)) == text  # the colon is in it
    # A comma whose place the crop only partly holds stays (the box runs past the ink).
    assert realrows.visible_truth("1/50,", (0, 0, 50, 20), (0, 0, 44, 20)) == "1/50,"
    # A letter or digit beyond the crop is never dropped: that region is not the line.
    assert realrows.visible_truth("TOTAL 12.50", (0, 0, 110, 20), (0, 0, 60, 20)) == "TOTAL 12.50"
    # At the start as at the end, and only what is outside.
    assert realrows.visible_truth(": 12.50 -", (0, 0, 90, 20), (25, 0, 90, 20)) == "12.50 -"
    assert realrows.visible_truth(":", (0, 0, 10, 20), (20, 0, 30, 20)) == ":"  # nothing left
