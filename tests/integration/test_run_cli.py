"""`ocrfleet run` end to end through the real CLI on embedded defaults: real engines on the
bundled examples, a real SQLite file, a real store directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageOps
from sqlalchemy import create_engine, text

from ocrfleet.metrics import cer, normalize_ws

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def ocrfleet(
    args: list[str], workdir: Path, python: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`ocrfleet ARGS` in `workdir` on its own SQLite file and store, with this test's
    python or another install's (`python`)."""
    environ = {
        **os.environ,
        "OCRFLEET_DATABASE_URL": f"sqlite:///{workdir / 'ocrfleet.db'}",
        "OCRFLEET_STORE_URL": f"file://{workdir / 'store'}",
        "OMP_THREAD_LIMIT": "1",
        **env,
    }
    return subprocess.run(
        [str(python or sys.executable), "-m", "ocrfleet.cli", *args],
        cwd=workdir,
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
    )


def page_texts(workdir: Path) -> dict[tuple[str, int], str]:
    engine = create_engine(f"sqlite:///{workdir / 'ocrfleet.db'}")
    texts: dict[tuple[str, int], list[str]] = {}
    with engine.connect() as conn:
        for uri, page, line in conn.execute(
            text(
                "SELECT d.source_uri, l.page_number, l.text FROM document_text_lines l "
                "JOIN documents d ON d.id = l.document_id "
                "ORDER BY d.id, l.page_number, l.region_number"
            )
        ):
            texts.setdefault((Path(uri).name, page), []).append(line or "")
    engine.dispose()
    return {key: "\n".join(lines) for key, lines in texts.items()}


@pytest.fixture(scope="module")
def examples_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    workdir = tmp_path_factory.mktemp("run")
    done = ocrfleet(["run", "--json", "--jobs", "2", str(EXAMPLES)], workdir)
    assert done.returncode == 0, done.stderr
    return workdir, json.loads(done.stdout)


def run_stats(stderr: str) -> dict:
    """The `run: {...}` line `ocrfleet run --json` prints on stderr."""
    line = next(line for line in stderr.splitlines() if line.startswith("run: "))
    return json.loads(line.removeprefix("run: "))


def page_outputs(workdir: Path) -> dict[tuple[str, int], tuple[str, str]]:
    """Each page's run and output hash (regions, texts, scores and decisions), by input
    name and page number."""
    engine = create_engine(f"sqlite:///{workdir / 'ocrfleet.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT d.source_uri, p.number, d.run_id, p.output_sha256 FROM pages p "
                "JOIN documents d ON d.id = p.document_id"
            )
        ).all()
    engine.dispose()
    return {(Path(uri).name, number): (run, output) for uri, number, run, output in rows}


def example_inputs() -> list[Path]:
    return sorted(p for p in EXAMPLES.iterdir() if p.with_name(p.name + ".gt.txt").exists())


def test_examples_exist() -> None:
    assert len(example_inputs()) >= 3


@pytest.mark.parametrize("source", example_inputs(), ids=lambda p: p.name)
def test_example_text_is_recovered(examples_run: tuple[Path, list[dict]], source: Path) -> None:
    workdir, summary = examples_run
    row = next(r for r in summary if Path(r["input"]).name == source.name)
    assert row["status"] == "done"
    truth_pages = source.with_name(source.name + ".gt.txt").read_text().split("\f")
    assert row["pages"] == len(truth_pages)
    texts = page_texts(workdir)
    for number, truth in enumerate(truth_pages, start=1):
        hypothesis = texts.get((source.name, number), "")
        assert cer(normalize_ws(hypothesis), normalize_ws(truth)) <= 0.05, (number, hypothesis)


def test_second_run_is_a_noop_reporting_the_same_documents(
    examples_run: tuple[Path, list[dict]],
) -> None:
    workdir, first = examples_run
    engine = create_engine(f"sqlite:///{workdir / 'ocrfleet.db'}")
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM candidates")).scalar_one()
    again = ocrfleet(["run", "--json", str(EXAMPLES)], workdir)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert [r["document_id"] for r in second] == [r["document_id"] for r in first]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM candidates")).scalar_one() == before
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 1
    engine.dispose()


def test_a_run_from_an_install_without_torch_is_the_same_run_and_a_noop(
    examples_run: tuple[Path, list[dict]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The README's client-only install (no models extra: no torch, no transformers) runs
    the CPU engines under the run of this install, which has them: nothing is redone."""
    from tests import client_venv

    workdir, first = examples_run
    try:
        python = client_venv.build(tmp_path_factory.mktemp("client") / "venv")
    except client_venv.VenvUnavailable as exc:
        pytest.skip(f"no client-only venv can be built offline here: {exc}")
    engine = create_engine(f"sqlite:///{workdir / 'ocrfleet.db'}")
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM candidates")).scalar_one()
    again = ocrfleet(["run", "--json", str(EXAMPLES)], workdir, python=python, PYTHONPATH=str(REPO))
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert [r["document_id"] for r in second] == [r["document_id"] for r in first]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM candidates")).scalar_one() == before
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 1
    engine.dispose()


def test_results_prints_text_and_json(examples_run: tuple[Path, list[dict]]) -> None:
    workdir, summary = examples_run
    source = example_inputs()[0]
    as_text = ocrfleet(["results", str(source)], workdir)
    assert as_text.returncode == 0, as_text.stderr
    truth = source.with_name(source.name + ".gt.txt").read_text().replace("\f", "\n")
    assert cer(normalize_ws(as_text.stdout), normalize_ws(truth)) <= 0.05
    as_json = ocrfleet(["results", str(summary[0]["document_id"]), "--format", "json"], workdir)
    structure = json.loads(as_json.stdout)
    assert structure["status"] == "done"
    assert structure["pages"][0]["regions"][0]["words"]
    as_hocr = ocrfleet(["results", str(source), "--format", "hocr"], workdir)
    assert as_hocr.returncode == 0, as_hocr.stderr
    assert as_hocr.stdout.count('class="ocrx_word"') == len(as_text.stdout.split())


def test_bad_inputs_are_rejected_and_the_run_goes_on(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "empty.pdf").write_bytes(b"")
    (inputs / "notes.png").write_bytes(b"this is plain text, not an image\n" * 20)
    good = example_inputs()[0]
    (inputs / good.name).write_bytes(good.read_bytes())
    done = ocrfleet(["run", "--json", str(inputs)], tmp_path)
    assert done.returncode == 1, done.stderr
    rows = {Path(r["input"]).name: r for r in json.loads(done.stdout)}
    assert rows["empty.pdf"]["status"] == "rejected"
    assert rows["empty.pdf"]["reason"].startswith("empty_file")
    assert rows["notes.png"]["status"] == "rejected"
    assert rows["notes.png"]["reason"].startswith("unsupported_type")
    assert rows[good.name]["status"] == "done"


def test_output_dir_gets_each_done_input_as_a_searchable_pdf(tmp_path: Path) -> None:
    """`run -o DIR` writes what `results --format pdf` writes, for done inputs only; a name
    two inputs share is kept apart by the document id."""
    inputs = tmp_path / "inputs"
    (inputs / "again").mkdir(parents=True)
    (inputs / "empty.pdf").write_bytes(b"")
    good = next(p for p in example_inputs() if p.suffix in (".png", ".jpg"))  # one page
    (inputs / good.name).write_bytes(good.read_bytes())
    upright = ImageOps.exif_transpose(Image.open(good)).convert("RGB")
    framed = ImageOps.expand(upright, border=40, fill="white")
    framed.save(inputs / "again" / good.name)  # another document under the same name
    out = tmp_path / "out"
    done = ocrfleet(["run", "--json", "-o", str(out), str(inputs)], tmp_path)
    assert done.returncode == 1, done.stderr  # the empty PDF is rejected
    rows = {r["input"]: r for r in json.loads(done.stdout)}
    ids = sorted(r["document_id"] for r in rows.values() if r["status"] == "done")
    assert len(ids) == 2
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([f"{good.stem}.pdf", f"{good.stem}-{ids[1]}.pdf"]), names
    truth = normalize_ws(good.with_name(good.name + ".gt.txt").read_text())
    for path in out.iterdir():
        assert cer(normalize_ws(pdf_text(path)), truth) <= 0.05, path.name
    shown = ocrfleet(["results", "--format", "pdf", "-o", "r.pdf", str(ids[0])], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert pdf_text(out / f"{good.stem}.pdf") == pdf_text(tmp_path / "r.pdf")
    bad = ocrfleet(["run", "-o", str(out), "--format", "docx", str(inputs)], tmp_path)
    assert bad.returncode == 2 and "--format" in bad.stderr


def pdf_text(path: Path) -> str:
    return subprocess.run(
        ["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True, check=True
    ).stdout


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert ocrfleet(["run", str(tmp_path / "missing")], tmp_path).returncode == 2
    assert ocrfleet(["results", "12345"], tmp_path).returncode == 2


def test_one_job_makes_the_same_rows_as_two(
    examples_run: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    """`--jobs 2` (the fixture's run) reads every page as one process does: the same run,
    and the same output hash on every page."""
    workdir, _ = examples_run
    single = ocrfleet(["run", "--json", "--jobs", "1", str(EXAMPLES)], tmp_path)
    assert single.returncode == 0, single.stderr
    stats = run_stats(single.stderr)
    assert stats["jobs"] == 1 and stats["pages"] == len(page_outputs(tmp_path))
    assert stats["peak_rss_mb"] > 100  # the models alone take more
    together = page_outputs(workdir)
    assert len(together) >= 4 and all(output for _, output in together.values())
    assert page_outputs(tmp_path) == together


def page_engines(workdir: Path, name: str) -> dict[int, tuple[set[str], dict | None]]:
    """Each page of input `name`: the engines of its candidates and its text-layer params."""
    engine = create_engine(f"sqlite:///{workdir / 'ocrfleet.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.number, c.engine, json_extract(p.params, '$.text_layer') FROM pages p "
                "JOIN documents d ON d.id = p.document_id "
                "JOIN regions r ON r.page_id = p.id JOIN candidates c ON c.region_id = r.id "
                "WHERE d.source_uri LIKE :name"
            ),
            {"name": f"%/{name}"},
        ).all()
    engine.dispose()
    pages: dict[int, tuple[set[str], dict | None]] = {}
    for number, engine_name, layer in rows:
        engines, _ = pages.setdefault(number, (set(), json.loads(layer) if layer else None))
        engines.add(engine_name)
    return pages


def test_a_pdf_text_layer_is_read_and_verified_unless_redo(
    examples_run: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    """The letter is a PDF with a real text layer: by default its pages are read from it
    (engine pdf-text, scored like any engine; the text test above holds it to its ground
    truth); scans have none. `--redo-ocr` OCRs it, under another run."""
    workdir, _ = examples_run
    used = page_engines(workdir, "letter.pdf")
    assert len(used) == 2
    for engines, layer in used.values():
        assert engines == {"pdf-text"}
        assert layer is not None and layer["used"] and layer["ink_coverage"] > 0.9
    scanned = page_engines(workdir, "memo.tif")
    assert scanned and all(e == {"rapidocr"} and layer is None for e, layer in scanned.values())

    redo = ocrfleet(["run", "--json", "--redo-ocr", str(EXAMPLES / "letter.pdf")], tmp_path)
    assert redo.returncode == 0, redo.stderr
    for engines, layer in page_engines(tmp_path, "letter.pdf").values():
        assert engines == {"rapidocr"} and layer is None
    runs = {run for run, _ in page_outputs(tmp_path).values()}
    assert runs.isdisjoint(run for run, _ in page_outputs(workdir).values())
