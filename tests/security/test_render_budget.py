"""Finding 2 of issue 18: a 2 KB PDF could exhaust an ingest worker. PDF bombs of
bench/hostile.py (Form XObjects nested 7 and 8 deep, a content stream that inflates to
768 MiB) against a real Celery ingest worker and against `ocrfleet run`, under a small
budget: each ends `rejected: render_budget`, the worker's processes stay under a stated
memory cap over their baseline, and the same worker process splits the next document."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.hostile import pdf_inflate_bomb, pdf_xobject_bomb
from ocrfleet import client
from ocrfleet.config import Settings
from ocrfleet.pipeline.images import InputRejected
from ocrfleet.pipeline.sandbox import split_document
from tests.integration.conftest import env  # noqa: F401 - the fleet's fixture
from tests.integration.fleet_helpers import (
    Workers,
    descendants,
    make_document,
    process_env,
    rows,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration

BUDGET = {"OCRFLEET_RENDER_TIMEOUT_S": "5", "OCRFLEET_RENDER_MEMORY_MB": "512"}
MEMORY_CAP_MB = 1024  # the worker's processes together, over their baseline


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue  # gone between listing and reading
    return total / 1024


class TreeMemory:
    """Peak RSS of a process and all its descendants, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> float:
        return _rss_mb([self.pid, *descendants(self.pid)])

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.02)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _pool_processes(workers: Workers) -> list[int]:
    """The worker's own processes (launcher, Celery main and pool), not renderer children."""
    tree = [workers.proc.pid, *descendants(workers.proc.pid)]
    return sorted(pid for pid in tree if "ocrfleet.pipeline.sandbox" not in _cmdline(pid))


@pytest.fixture
def ingest_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:  # noqa: F811
    workers = start_workers(
        {**env, **BUDGET}, tmp_path / "ingest.log", queues="ingest", concurrency=1
    )
    try:
        yield workers
    finally:
        workers.stop()


def _wait_ready(env: dict[str, str], workers: Workers) -> None:  # noqa: F811
    """A first small document through the worker: its models and connections are up."""
    settings = settings_from(env)
    doc = client.submit(make_document(1, 1), settings=settings)
    deadline = time.monotonic() + 180
    while client.status(doc, settings=settings).page_count is None:
        assert workers.proc.poll() is None, workers.log_tail()
        assert time.monotonic() < deadline, workers.log_tail()
        time.sleep(0.2)


@pytest.mark.finding(
    2,
    before="a 1,992-byte PDF (XObjects 7 deep): 21 s and 1.84 GB; 8 deep: over 90 s, 8.6 GB",
    after="rejected: render_budget within the budget (5 s, 512 MB here); worker under "
    "+1 GB; the same worker splits the next document",
)
def test_pdf_bombs_are_rejected_and_the_worker_goes_on(
    env: dict[str, str],  # noqa: F811
    ingest_worker: Workers,
) -> None:
    settings = settings_from(env)
    _wait_ready(env, ingest_worker)
    pool = _pool_processes(ingest_worker)
    bombs = {
        "xobjects_7_deep": pdf_xobject_bomb(7),
        "xobjects_8_deep": pdf_xobject_bomb(8),
        "inflates_to_768_MiB": pdf_inflate_bomb(768),
    }
    with TreeMemory(ingest_worker.proc.pid) as memory:
        baseline = memory.now()
        ids = {
            name: client.submit(data, priority="high", settings=settings)
            for name, data in bombs.items()
        }
        states = wait_finished(list(ids.values()), settings, timeout=240, workers=ingest_worker)
        after = client.submit(make_document(2, 2), settings=settings)
        deadline = time.monotonic() + 120
        while client.status(after, settings=settings).page_count is None:
            assert time.monotonic() < deadline, ingest_worker.log_tail()
            time.sleep(0.2)
    for (name, data), state in zip(bombs.items(), states, strict=True):
        print(f"{name}: {len(data)} bytes -> {state.status.value}: {state.reason}")
        assert len(data) < 16_000
        assert state.status.value == "rejected", (name, state)
        assert state.reason.startswith("render_budget: "), (name, state.reason)
    print(f"worker tree RSS: baseline {baseline:.0f} MB, peak {memory.peak:.0f} MB")
    assert memory.peak - baseline < MEMORY_CAP_MB

    # The same worker process split the next document: no pool process was replaced.
    state = client.status(after, settings=settings)
    assert (state.status.value, state.page_count) == ("processing", 2), state
    url = env["OCRFLEET_DATABASE_URL"]
    assert rows(url, "SELECT count(*) FROM pages WHERE document_id = :d", d=after) == [(2,)]
    assert _pool_processes(ingest_worker) == pool
    log = ingest_worker.log_tail(10**7)
    assert "WorkerLostError" not in log and "exited with 'signal" not in log


@pytest.mark.finding(
    2,
    before="no time limit on a page render",
    after="a page over render_timeout_s: rejected render_budget; the next input renders",
)
def test_a_slow_page_times_out_and_the_next_input_renders() -> None:
    """The wall-clock limit, in this process as `ocrfleet run` uses it: a page that needs
    seconds gets a fraction of one; the child is replaced and the next input renders."""
    settings = Settings(_env_file=None, dpi=100, render_timeout_s=0.3, render_memory_mb=1024)
    slow = pdf_xobject_bomb(6)
    with pytest.raises(InputRejected) as rejected, split_document(slow, settings, "s.pdf") as split:
        list(split.pages())
    assert rejected.value.reason == "render_budget"
    assert rejected.value.detail == "page 1 took over 0.3 s (render_timeout_s)"
    settings = Settings(_env_file=None, dpi=100, render_timeout_s=30)
    with split_document(make_document(3, 2), settings, "next.pdf") as split:
        pages = list(split.pages())
    assert [(page.number, page.width, page.height) for page in pages] == [
        (1, 420, 150),
        (2, 420, 150),
    ]
    assert all(page.png.startswith(b"\x89PNG") for page in pages)


@pytest.mark.finding(
    2,
    before="`ocrfleet run` rendered a bomb in-process, with no budget",
    after="`ocrfleet run`: the bomb rejected render_budget, the other input done, exit 1",
)
def test_ocrfleet_run_rejects_a_bomb_and_goes_on(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "bomb.pdf").write_bytes(pdf_xobject_bomb(8))
    (inputs / "letter.pdf").write_bytes(make_document(4, 1))
    run_env = {
        **process_env({}),
        **BUDGET,
        "OCRFLEET_DATABASE_URL": f"sqlite:///{tmp_path / 'ocrfleet.db'}",
        "OCRFLEET_STORE_URL": f"file://{tmp_path / 'store'}",
        "OCRFLEET_CACHE_DIR": str(tmp_path / "cache"),
        "OCRFLEET_DPI": "100",
    }
    done = subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", "run", "--json", str(inputs)],
        cwd=tmp_path,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    summary = {Path(row["input"]).name: row for row in json.loads(done.stdout)}
    assert summary["letter.pdf"]["status"] == "done"
    assert summary["bomb.pdf"]["status"] == "rejected"
    assert summary["bomb.pdf"]["reasons"][0].startswith("render_budget: ")
