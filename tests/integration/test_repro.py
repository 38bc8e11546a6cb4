"""`ocrfleet repro` through the real CLI: one input three times under one run, and two stored
runs that differ in one setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.integration.test_run_cli import EXAMPLES, ocrfleet

pytestmark = pytest.mark.integration

EXAMPLE = EXAMPLES / "photo.jpg"  # one page, stored sideways (EXIF orientation)


def test_three_runs_of_an_example_give_three_identical_hashes(tmp_path: Path) -> None:
    done = ocrfleet(["repro", str(EXAMPLE), "--times", "3", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["output_sha256"]) == 3
    assert len(set(report["output_sha256"])) == 1
    assert report["identical"] is True and report["counts"] == {}
    assert len(report["run_id"]) == 64


def test_repro_reads_a_page_as_the_run_did_orientation_included(tmp_path: Path) -> None:
    """One page path: a page stored sideways (no EXIF to undo it) is turned upright by the
    page pipeline itself, so `ocrfleet repro` reproduces what `ocrfleet run` stored."""
    from PIL import Image

    from ocrfleet.repro import document_sha256

    turned = tmp_path / "turned.png"
    Image.open(EXAMPLES / "scan.png").transpose(Image.Transpose.ROTATE_90).save(turned)
    done = ocrfleet(["run", "--json", str(turned)], tmp_path)
    assert done.returncode == 0, done.stderr
    engine = create_engine(f"sqlite:///{tmp_path / 'ocrfleet.db'}")
    with engine.connect() as conn:
        stored, params = conn.execute(text("SELECT output_sha256, params FROM pages")).one()
    engine.dispose()
    params = json.loads(params) if isinstance(params, str) else params
    assert params["orientation"]["applied"] is True, params
    again = ocrfleet(["repro", str(turned), "--times", "2", "--json"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["output_sha256"] == [document_sha256([stored])] * 2


def test_a_changed_setting_gives_another_run_and_a_classified_report(tmp_path: Path) -> None:
    for layout in ("rapid", "lines"):
        done = ocrfleet(["run", "--json", str(EXAMPLE)], tmp_path, OCRFLEET_LAYOUT=layout)
        assert done.returncode == 0, done.stderr
    engine = create_engine(f"sqlite:///{tmp_path / 'ocrfleet.db'}")
    with engine.connect() as conn:
        runs = [row[0] for row in conn.execute(text("SELECT id FROM runs ORDER BY created_at"))]
        pages = conn.execute(text("SELECT input_sha256, width FROM pages")).all()
    engine.dispose()
    assert len(runs) == 2 and runs[0] != runs[1]
    # Every page records the sha256 of the image it read: the same image in both runs.
    assert len(pages) == 2 and all(sha is not None for sha, _ in pages)
    assert len({sha for sha, _ in pages}) == 1

    done = ocrfleet(["repro", "--against", *runs, "--json"], tmp_path)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["identical"] is False
    changed = report["config changed"]
    assert "layout: 'rapid' -> 'lines'" in changed
    assert "engines.detector.name: 'rapid-layout' -> 'rapidocr'" in changed
    # The layout run numbers its text lines by block: the regions changed, not the words.
    assert report["counts"].get("structure", 0) >= 1
    assert set(report["counts"]) <= {
        "whitespace", "punctuation", "substitution", "missing_line", "extra_line", "structure"
    }
    assert sum(report["counts"].values()) == len(report["differences"])
    first = report["differences"][0]
    assert {"kind", "page", "region_a", "region_b", "text_a", "text_b"} <= set(first)

    same = ocrfleet(["repro", "--against", runs[0], runs[0]], tmp_path)
    assert same.returncode == 0, same.stderr
    assert "identical" in same.stdout
