"""The label audit's corrections (bench/realrows.py's `load_rows` applies them to every
row's label): a correction applies to its line only, and is never silently stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import label_audit, realrows
from ocrfleet.metrics import normalize_ws
from tests.conftest import REALDOCS

HEADER = "set,document,line,original,corrected,reason\n"
SROIE = REALDOCS.parent / "train" / "sroie"


@pytest.fixture
def corrections_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Point the loader at a corrections file the test writes."""
    path = tmp_path / "corrections.csv"
    monkeypatch.setattr(label_audit, "CORRECTIONS", path)
    label_audit.corrections.cache_clear()
    yield path
    label_audit.corrections.cache_clear()


def test_a_correction_applies_and_other_lines_keep_their_annotation(corrections_file) -> None:
    corrections_file.write_text(HEADER + 'sroie,X51,3,"AMOUT, RM",AMOUNT RM,transcript typo\n')
    assert label_audit.audited("sroie", "X51", "3", "AMOUT, RM") == "AMOUNT RM"
    assert label_audit.audited("sroie", "X51", "4", "AMOUT, RM") == "AMOUT, RM"
    assert label_audit.audited("uw3", "X51", "3", "AMOUT, RM") == "AMOUT, RM"
    (fix,) = label_audit.corrections().values()
    assert (fix.original, fix.reason) == ("AMOUT, RM", "transcript typo")


def test_a_stale_correction_is_an_error(corrections_file) -> None:
    corrections_file.write_text(HEADER + "uw3,0005,010001,THANE YOU,THANK YOU,typo\n")
    with pytest.raises(label_audit.StaleCorrection, match="0005 line 010001 corrects 'THANE"):
        label_audit.audited("uw3", "0005", "010001", "THANK YOU")


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ("sroie,a,1,x,y,r\nsroie,a,1,x,z,r\n", "corrected twice"),
        ("books,a,1,x,y,r\n", "unknown set"),
        ("sroie,a,1,x,y,\n", "needs its text and reason"),
        ("sroie,a,1,x, ,r\n", "needs its text and reason"),
        ("sroie,a,1,x,x,r\n", "changes nothing"),
        ("sroie,a,1,x,y\n", "expected 6 fields"),
    ],
)
def test_a_malformed_file_names_its_row(corrections_file, rows: str, error: str) -> None:
    corrections_file.write_text(HEADER + rows)
    with pytest.raises(ValueError, match=f"corrections.csv:[23]: .*{error}"):
        label_audit.corrections()


def test_wrong_columns_are_refused(corrections_file) -> None:
    corrections_file.write_text("set,doc,line,original,corrected,reason\n")
    with pytest.raises(ValueError, match="the columns must be"):
        label_audit.corrections()


@pytest.mark.skipif(not SROIE.is_dir(), reason="the training data is not here")
def test_every_shipped_correction_matches_its_annotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repository's file against the annotations it corrects: none is stale (a PDF
    manual's annotation is its text layer's line, where the manual is installed)."""
    from ocrfleet.config import Settings

    monkeypatch.setattr(realrows, "OUT", tmp_path)  # the page renders pdf_docs keeps
    layers = {
        (doc, row.line): row.truth for doc, rows in realrows.pdf_docs(Settings()) for row in rows
    }
    label_audit.corrections.cache_clear()
    for (name, document, line), fix in label_audit.corrections().items():
        if name == "pdf":
            assert any(document == Path(m).parent.name for m in realrows.DEBIAN_MANUALS)
            if (document, line) not in layers and not any(d == document for d, _ in layers):
                continue  # that manual's Debian package is not installed here
            original = layers[(document, line)]
        elif name == "sroie":
            row = (SROIE / "box" / f"{document}.csv").read_text(encoding="utf-8").splitlines()
            original = row[int(line)].split(",", 8)[8].strip()
        elif name == "uw3":
            path = realrows.UW3_BOOK / document / f"{line}.gt.txt"
            original = path.read_text(encoding="utf-8").strip()
        else:
            page = (realrows.REALDOCS / "tesseract_test" / f"{document}.txt").read_text("utf-8")
            original = normalize_ws(page.splitlines()[int(line)])
        assert label_audit.audited(name, document, line, original) == fix.corrected
