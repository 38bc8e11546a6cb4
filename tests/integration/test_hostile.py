"""No input can stop a run: the hostile corpus of bench/hostile.py through `ocrfleet run`
and through the fleet with real workers. The run completes with exit code 1 and no
traceback; every document ends terminal with a specific reason where it is not done; text
on odd pages (sideways, upside down, /Rotate, a 59 Mpx page, a non-UTF-8 name) is read; no
store object is left for a rejected input; no input restarts a worker."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from bench.hostile import SETTINGS, VANISHED, Kind, build, run_corpus, table
from ocrfleet import client
from ocrfleet.metrics import cer
from ocrfleet.storage.local import file_uri_to_path
from tests.conftest import REPO
from tests.integration.fleet_helpers import (
    Workers,
    rows,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration


def read(expected: str, text: str) -> bool:
    """`expected` occurs in `text` up to OCR noise: some line is within 15% CER of it."""
    lines = [line for line in text.splitlines() if line.strip()]
    return any(cer(line[: len(expected) + 8], expected) <= 0.15 for line in lines) or (
        expected.lower() in text.lower()
    )


def print_table(title: str, entries: list[tuple[str, str, str]]) -> None:
    width = max(len(name) for name, _, _ in entries)
    print(f"\n{title}")
    for name, state, reason in entries:
        print(f"  {name:<{width}}  {state:<8}  {reason[:100]}")


@pytest.fixture(scope="module")
def corpus_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]]:
    root = tmp_path_factory.mktemp("hostile")
    made = build(root / "inputs")
    done, _ = run_corpus(root / "inputs", root)
    rows_ = json.loads(done.stdout) if done.stdout.strip() else []
    return root, made, done, rows_


def test_the_corpus_has_every_kind_the_issue_names(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    _, made, _, _ = corpus_run
    names = {kind.name for kind in made}
    assert len(made) >= 40
    assert {
        "strip_20000x10",
        "strip_20000x60",
        "non_utf8_name",
        "file_removed_mid_run",
        "large_page_small_text",
        "tiff_third_frame_truncated",
        "pdf_rotate_90",
    } <= names


def test_ocrfleet_run_survives_the_corpus(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    root, made, done, summary = corpus_run
    entries = table(made, summary)
    print_table("ocrfleet run: kind -> state -> reason", entries)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    by_kind = {name: (state, reason) for name, state, reason in entries}
    for kind in made:
        state, reason = by_kind[kind.name]
        assert state == kind.state, (kind.name, state, reason)
        if kind.state == "rejected":
            assert reason.startswith(kind.reason + ":"), (kind.name, reason)
    # Every skipped file is named, with why, on stderr.
    skipped = json.loads(done.stderr.split("skipped ", 1)[1].split(": ", 1)[1].splitlines()[0])
    whys = {Path(s["path"]).name: s["why"] for s in skipped}
    for kind in made:
        if kind.state == "skipped":
            assert kind.reason in whys[kind.filename], (kind.name, whys)


def test_text_on_odd_pages_is_read(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    root, made, _, summary = corpus_run
    ids = {Path(row["input"]).name: row["document_id"] for row in summary}
    env = _env(root)
    for kind in made:
        if not kind.text:
            continue
        shown = kind.filename.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        out = _cli(env, root, "results", str(ids[shown]))
        assert out.returncode == 0, (kind.name, out.stderr)
        assert read(kind.text, out.stdout), (kind.name, out.stdout)


def test_orientation_and_detection_are_recorded(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    root, _, _, summary = corpus_run
    ids = {Path(row["input"]).name: row["document_id"] for row in summary}
    url = f"sqlite:///{root / 'ocrfleet.db'}"

    def params(name: str) -> dict:
        (value,) = rows(url, "SELECT params FROM pages WHERE document_id = :d", d=ids[name])[0]
        return json.loads(value) if isinstance(value, str) else value

    assert params("rotate90.pdf")["orientation"]["applied"]
    assert params("upside-down.png")["orientation"]["angle"] == 180
    # A page the check turned is stored upright: the row's image is the one its regions'
    # pixels are in, so the PDF, hOCR, ALTO and the review crops draw them where they are.
    for name in ("rotate90.pdf", "upside-down.png"):
        sql = "SELECT width, height, image_uri FROM pages WHERE document_id = :d"
        ((width, height, uri),) = rows(url, sql, d=ids[name])
        assert (width, height) == (params(name)["width"], params(name)["height"])
        assert uri.endswith(f".upright{params(name)['orientation']['angle']}.png"), uri
        with Image.open(file_uri_to_path(uri)) as stored:
            assert stored.size == (width, height)
    pdf = root / "rotate90.out.pdf"
    document = str(ids["rotate90.pdf"])
    written = _cli(_env(root), root, "results", "--format", "pdf", "-o", str(pdf), document)
    assert written.returncode == 0, written.stderr
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    assert "Shipment 2231 left the depot" in " ".join(text.split()), text
    assert params("scan.bmp")["orientation"]["applied"] is False
    assert params("large-7700.png")["detection"]["method"] == "tiles"
    assert params("strip-20000x10.png")["detection"]["windows"] > 1
    # 520x150: read, as rapidocr reads it, with its short side scaled up to 736 px; over the
    # window budget at that scale, so in bands.
    scan = params("scan.bmp")["detection"]
    assert scan["method"] == "tiles" and scan["scale"] == pytest.approx(736 / 150)


def test_nothing_is_left_behind_and_gc_finds_orphans(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    root, _, _, summary = corpus_run
    env = _env(root)
    store = root / "store"
    done_shas = {row["sha256"] for row in summary if row["status"] == "done"}
    stored = {p.relative_to(store).parts[1] for p in (store / "derived").rglob("*.png")}
    assert stored == done_shas  # in particular nothing of the TIFF cut in its third frame
    assert not any(row["status"] == "processing" for row in summary)

    dry = _cli(env, root, "gc")
    assert dry.returncode == 0 and dry.stdout == "", dry.stderr
    assert dry.stderr.startswith("0 object(s)")
    orphan = store / "derived" / ("0" * 64) / "200dpi" / "p0001.png"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"left over")
    listed = _cli(env, root, "gc")
    assert listed.stdout.split() == [f"derived/{'0' * 64}/200dpi/p0001.png"]
    assert orphan.exists()
    deleted = _cli(env, root, "gc", "--delete")
    assert deleted.returncode == 0 and not orphan.exists()
    assert deleted.stderr.startswith("1 object(s) deleted")


def test_results_of_a_rejected_document_says_so(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    root, _, _, summary = corpus_run
    env = _env(root)
    rejected = next(row for row in summary if Path(row["input"]).name == "locked.pdf")
    out = _cli(env, root, "results", str(rejected["document_id"]))
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"document {rejected['document_id']} is rejected")
    assert "encrypted_pdf:" in out.stderr
    # Pages of a multi-page document are separated by a form feed.
    memo = next(row for row in summary if Path(row["input"]).name == "memo.tif")
    text = _cli(env, root, "results", str(memo["document_id"])).stdout
    assert text.count("\f") == 2 and "3" in text.split("\f")[2]


def test_status_lists_recent_documents_and_all(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    root, _, _, summary = corpus_run
    env = _env(root)
    recent = json.loads(_cli(env, root, "status", "--json").stdout)
    everything = json.loads(_cli(env, root, "status", "--all", "--json").stdout)
    assert len(recent) == 20 and len(everything) == len(summary)
    assert recent[0]["id"] == max(row["document_id"] for row in summary)
    plain = _cli(env, root, "status", "--all", env_extra={"COLUMNS": "80"})
    assert plain.returncode == 1, plain.stderr  # rejected documents are among those shown
    assert max(len(line) for line in plain.stdout.splitlines()) <= 80
    assert re.search(r"^\s+\d+ rejected: encrypted_pdf: ", plain.stdout, re.MULTILINE)


def test_the_run_summary_reads_at_80_columns(
    corpus_run: tuple[Path, list[Kind], subprocess.CompletedProcess[str], list[dict]],
) -> None:
    root, _, _, _ = corpus_run
    env = _env(root)
    again = _cli(env, root, "run", str(root / "inputs"), env_extra={"COLUMNS": "80"})
    assert again.returncode == 1, again.stderr
    lines = again.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.strip().startswith("encrypted_pdf: ") for line in lines)
    assert re.search(r"^skipped 4 file\(s\)", again.stdout, re.MULTILINE)


def test_bad_settings_and_usage_are_one_line_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OCRFLEET_CACHE_DIR": str(tmp_path / "c")}
    bad = _cli({**env, "OCRFLEET_DPI": "5"}, tmp_path, "run", str(tmp_path))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: configuration: OCRFLEET_DPI: Input should be greater than or equal to 36 (got '5')"
    ]
    usage = _cli(env, tmp_path, "run", "--no-such-option")
    assert usage.returncode == 2 and len(usage.stderr.strip().splitlines()) == 1
    store = _cli({**env, "OCRFLEET_STORE_URL": "ftp://x"}, tmp_path, "gc")
    assert store.returncode == 2 and len(store.stderr.strip().splitlines()) == 1


def _env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "OCRFLEET_DATABASE_URL": f"sqlite:///{root / 'ocrfleet.db'}",
        "OCRFLEET_STORE_URL": f"file://{root / 'store'}",
        "OCRFLEET_CACHE_DIR": str(root / "cache"),
        "OMP_THREAD_LIMIT": "1",
        "PYTHONPATH": str(REPO),
        **SETTINGS,
    }


def _cli(
    env: dict[str, str], cwd: Path, *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", *args],
        cwd=cwd,
        env={**env, **(env_extra or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture
def fleet_workers() -> Iterator[list[Workers]]:
    started: list[Workers] = []
    yield started
    for workers in started:
        workers.stop()


def test_the_fleet_survives_the_corpus(
    env: dict[str, str], tmp_path: Path, fleet_workers: list[Workers]
) -> None:
    """The same corpus submitted to real workers: the intake object of one input is deleted
    after submit (the fleet's "file removed mid-run"); every document ends terminal, no page
    is delivered twice, no worker restarts, nothing is stored for a rejected input."""
    import boto3

    # Pages of 4 to 6 detector windows: room for a loaded 2-core machine.
    limits = {
        "OCRFLEET_TASK_SOFT_TIME_LIMIT": "400",
        "OCRFLEET_TASK_TIME_LIMIT": "450",
        "OCRFLEET_VISIBILITY_TIMEOUT": "500",
    }
    env = {**env, **SETTINGS, **limits}
    settings = settings_from(env)
    made = build(tmp_path / "inputs")
    ids: dict[str, int] = {}
    for kind in made:
        if kind.state != "skipped":
            ids[kind.name] = client.submit(tmp_path / "inputs" / kind.filename, settings=settings)
    bucket = env["OCRFLEET_STORE_URL"].removeprefix("s3://").split("/")[0]
    s3 = boto3.client("s3", endpoint_url=env["OCRFLEET_S3_ENDPOINT_URL"])
    vanished = client.status(ids["file_removed_mid_run"], settings=settings)
    s3.delete_object(Bucket=bucket, Key=f"fleet/intake/{vanished.sha256}")

    workers = start_workers(env, tmp_path / "workers.log", queues="gpu,ingest", devices="cpu:1")
    fleet_workers.append(workers)
    states = {
        state.id: state
        for state in wait_finished(list(ids.values()), settings, timeout=900, workers=workers)
    }
    entries = []
    for kind in made:
        if kind.state == "skipped":
            continue
        state = states[ids[kind.name]]
        reason = state.reason or ""
        entries.append((kind.name, state.status.value, reason))
        if kind.name == "file_removed_mid_run":
            assert (state.status.value, reason.split(":")[0]) == ("failed", "ObjectNotFound")
        else:
            assert state.status.value == kind.state, (kind.name, state)
        if kind.state == "rejected" and kind.name != "file_removed_mid_run":
            assert reason.startswith(kind.reason + ":"), (kind.name, reason)
    print_table("the fleet: kind -> state -> reason", entries)

    url = env["OCRFLEET_DATABASE_URL"]
    assert rows(url, "SELECT DISTINCT deliveries FROM pages") == [(1,)]
    log = workers.log_tail(10**7)
    assert "restarting in" not in log and "WorkerLostError" not in log
    assert "exited with 'signal" not in log
    keys = s3.list_objects_v2(Bucket=bucket, Prefix="fleet/derived/").get("Contents", [])
    stored = {item["Key"].split("/")[2] for item in keys}
    done = {states[ids[k.name]].sha256 for k in made if k.state == "done"}
    assert stored == done
    assert VANISHED in {kind.filename for kind in made}


def test_a_page_or_input_that_raises_fails_alone(sqlite_url: str, tmp_path: Path) -> None:
    """Real faults, no mocks: a page image gone from the store fails its page (the document
    ends partial, the next page is read); a store that cannot take an input's pages fails
    that document with the exception's first line, and the next input still ingests."""
    from ocrfleet import ir
    from ocrfleet.config import Settings
    from ocrfleet.db import models
    from ocrfleet.db.migrate import upgrade
    from ocrfleet.service import Context, ingest, run_page
    from tests.integration.fleet_helpers import make_pdf

    upgrade(sqlite_url)
    store = tmp_path / "store"
    ctx = Context(Settings(database_url=sqlite_url, store_url=f"file://{store}", dpi=100))
    outcome = ingest(ctx, "upload/two.pdf", data=make_pdf([["Page one"], ["Harbour 1702"]]))
    first, second = outcome.page_ids
    with ctx.session() as session:
        ctx.store.delete(ctx.store.key_of(session.get(models.Page, first).image_uri))
    assert run_page(ctx, first) == ir.PageStatus.failed
    assert run_page(ctx, second) == ir.PageStatus.done
    with ctx.session() as session:
        page = session.get(models.Page, first)
        assert page.reason.startswith("ObjectNotFound: get ")
        doc = session.get(models.Document, outcome.document_id)
        assert (doc.status, doc.pages_done, doc.pages_failed) == ("partial", 1, 1)

    blocked = make_pdf([["Blocked"]])
    sha = hashlib.sha256(blocked).hexdigest()
    (store / "derived" / sha).parent.mkdir(parents=True, exist_ok=True)
    (store / "derived" / sha).write_bytes(b"a file where the page folder must go")
    failed = ingest(ctx, "upload/blocked.pdf", data=blocked)
    assert failed.status == ir.DocumentStatus.failed and failed.page_ids == []
    assert failed.reason.startswith("StorageError: put ")
    after = ingest(ctx, "upload/next.pdf", data=make_pdf([["Next one"]]))
    assert after.status == ir.DocumentStatus.processing and len(after.page_ids) == 1
