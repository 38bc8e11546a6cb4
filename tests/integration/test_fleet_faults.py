"""Faults while pages are in flight: a worker killed mid-page, a page that kills its worker
every time, and the chaos run on a fleet started as the README says: pool, main and ingest
processes killed, Redis killed with its data lost, PostgreSQL connections cut. Nothing is
lost, nothing is written twice."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, text

from ocrfleet import client
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.session import dispose_engines
from ocrfleet.tasks.heartbeat import WORKER_PREFIX
from ocrfleet.tasks.routing import PAGE_TASK
from tests.conftest import PG_ADMIN_URL, free_port, wait_for_port
from tests.integration.fleet_helpers import (
    Workers,
    assert_written_once,
    fleet_env,
    make_document,
    make_pdf,
    page_lines,
    queue_depths,
    rows,
    scalar,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration

HOOKS = "tests.integration.fleet_hooks"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def workers_factory() -> Iterator[list[Workers]]:
    started: list[Workers] = []
    yield started
    for workers in started:
        workers.stop()
    dispose_engines()


def _env(
    pg_url: str, broker_url: str, bucket: str, moto_endpoint: str, **extra: str
) -> dict[str, str]:
    upgrade(pg_url)
    return fleet_env(
        pg_url=pg_url, broker_url=broker_url, bucket=bucket, moto_endpoint=moto_endpoint, **extra
    )


def page_rows(url: str, document_id: int, number: int) -> list[tuple[object, ...]]:
    """A page's regions and candidates, without ids: comparable across documents."""
    return rows(
        url,
        "SELECT r.number, r.x0, r.y0, r.x1, r.y1, c.engine, c.text FROM pages p "
        "JOIN regions r ON r.page_id = p.id JOIN candidates c ON c.region_id = r.id "
        "WHERE p.document_id = :doc AND p.number = :number ORDER BY r.number, c.engine",
        doc=document_id,
        number=number,
    )


def test_killed_page_is_redelivered_and_a_poison_page_fails(
    pg_url: str,
    redis_url: str,
    s3_bucket: str,
    moto_endpoint: str,
    tmp_path: Path,
    workers_factory: list[Workers],
) -> None:
    kill_dir = tmp_path / "kills"
    kill_dir.mkdir()
    env = _env(pg_url, redis_url, s3_bucket, moto_endpoint, FLEET_KILL_DIR=str(kill_dir))
    settings = settings_from(env)
    url = env["OCRFLEET_DATABASE_URL"]

    # Twins: page 2 of A and page 2 of B are the same image. A's dies mid-transaction once.
    shared = page_lines(900, 5)
    doc_a = make_pdf([page_lines(901, 1), shared])
    doc_b = make_pdf([page_lines(902, 1), shared])
    # P's page 2 kills its worker on every delivery.
    doc_p = make_pdf([page_lines(903, n) for n in (1, 2, 3)])
    others = [make_document(910 + i, 2) for i in range(3)]
    (kill_dir / f"once-{sha(doc_a)}-2").touch()
    (kill_dir / f"always-{sha(doc_p)}-2").touch()

    workers = start_workers(env, tmp_path / "workers.log", devices="cpu:2", include=[HOOKS])
    workers_factory.append(workers)
    id_a, id_b, id_p, *id_others = (
        client.submit(blob, settings=settings) for blob in [doc_a, doc_b, doc_p, *others]
    )
    states = wait_finished([id_a, id_b, id_p, *id_others], settings, 900, workers)
    by_id = {state.id: state for state in states}

    # Killed once in the middle of its transaction: redelivered, done, written once.
    killed = (kill_dir / f"killed-once-{sha(doc_a)}-2").read_text().split()
    assert len(killed) == 1
    assert by_id[id_a].status.value == "done"
    deliveries = scalar(
        url, "SELECT deliveries FROM pages WHERE document_id = :d AND number = 2", d=id_a
    )
    assert deliveries == 2
    twin = page_rows(url, id_b, 2)
    assert twin and page_rows(url, id_a, 2) == twin
    outputs = rows(
        url,
        "SELECT DISTINCT output_sha256 FROM pages WHERE number = 2 AND document_id IN (:a, :b)",
        a=id_a,
        b=id_b,
    )
    assert len(outputs) == 1 and outputs[0][0]

    # Killed on every delivery: failed after max_deliveries, the rest of its document done.
    assert len((kill_dir / f"killed-always-{sha(doc_p)}-2").read_text().split()) == 3
    poison = rows(
        url,
        "SELECT status, deliveries, reason FROM pages WHERE document_id = :d ORDER BY number",
        d=id_p,
    )
    assert poison == [
        ("done", 1, None),
        ("failed", 4, "poison: delivered 4 times, exceeds max_deliveries=3"),
        ("done", 1, None),
    ]
    p_state = by_id[id_p]
    assert (p_state.status.value, p_state.pages_done, p_state.pages_failed) == ("partial", 2, 1)

    assert all(by_id[doc_id].status.value == "done" for doc_id in [id_b, *id_others])
    assert_written_once(url)


def test_time_limits_soft_fails_the_page_hard_requeues_it(
    pg_url: str,
    redis_url: str,
    s3_bucket: str,
    moto_endpoint: str,
    tmp_path: Path,
    workers_factory: list[Workers],
) -> None:
    """Over the soft limit: the page fails at once with the reason. Past the hard limit the
    pool kills the process; the page is requeued until the delivery cap fails it."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    env = _env(
        pg_url,
        redis_url,
        s3_bucket,
        moto_endpoint,
        FLEET_KILL_DIR=str(hooks),
        OCRFLEET_TASK_SOFT_TIME_LIMIT="8",
        # Room for the soft limit to land on a loaded machine, inside a native OCR call.
        OCRFLEET_TASK_TIME_LIMIT="20",
        OCRFLEET_VISIBILITY_TIMEOUT="40",
    )
    settings = settings_from(env)
    url = env["OCRFLEET_DATABASE_URL"]
    slow, stubborn = make_document(800, 1), make_document(801, 1)
    (hooks / f"slow-{sha(slow)}-1").touch()
    (hooks / f"stubborn-{sha(stubborn)}-1").touch()

    workers = start_workers(env, tmp_path / "workers.log", devices="cpu:2", include=[HOOKS])
    workers_factory.append(workers)
    id_slow, id_stubborn = (client.submit(blob, settings=settings) for blob in (slow, stubborn))
    wait_finished([id_slow, id_stubborn], settings, 600, workers)

    def page(doc_id: int) -> tuple[object, ...]:
        (row,) = rows(
            url, "SELECT status, deliveries, reason FROM pages WHERE document_id = :d", d=doc_id
        )
        return row

    assert page(id_slow) == ("failed", 1, "timeout: over the soft time limit of 8s")
    assert page(id_stubborn) == ("failed", 4, "poison: delivered 4 times, exceeds max_deliveries=3")
    for doc_id in (id_slow, id_stubborn):
        state = client.status(doc_id, settings=settings)
        assert (state.status.value, state.pages_failed) == ("partial", 1)
    assert scalar(url, "SELECT count(*) FROM regions") == 0  # nothing half-written
    assert "TimeLimitExceeded" in workers.log_tail(200_000)


class RedisServer:
    """A redis-server of this test's own, with an append-only file fsynced on every write
    (a production broker must persist: a Redis that forgets its queues loses messages)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wipe(self) -> None:
        """Forget everything, as a broker restored from nothing does."""
        shutil.rmtree(self.directory)
        self.directory.mkdir()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory)
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.terminate()
        server.proc.wait(timeout=10)


def pages_done(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM pages WHERE status = 'done'") or 0)


def wait_until(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def cut_connections(database: str) -> int:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :db AND pid <> pg_backend_pid()"
                    ),
                    {"db": database},
                ).all()
            )
    finally:
        admin.dispose()


def _heartbeats(broker_url: str) -> list[dict[str, Any]]:
    conn = redis.Redis.from_url(broker_url)
    try:
        return [json.loads(raw) for raw in conn.mget(conn.keys(f"{WORKER_PREFIX}*")) if raw]
    finally:
        conn.close()


def _busy_device_worker(broker_url: str) -> dict[str, Any] | None:
    """The heartbeat of a device worker running a page now (started, not just reserved)."""
    for record in _heartbeats(broker_url):
        if any(held["task"] == PAGE_TASK and held.get("started") for held in record["held"]):
            return record
    return None


def _pool_children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


class DoneTimes:
    """When each page was first seen `done`, polled from the database in a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # the cuts hit this connection too
                now = time.monotonic()
                for (page_id,) in rows(self.url, "SELECT id FROM pages WHERE status = 'done'"):
                    self.at.setdefault(int(page_id), now)  # type: ignore[arg-type]
            self._stop.wait(0.25)

    def seen(self, pages: set[int], timeout: float = 10.0) -> bool:
        """Whether every page of `pages` is seen done within `timeout`: the poll runs every
        0.25 s, so a page done just now may not be in `at` yet."""
        deadline = time.monotonic() + timeout
        while not pages <= set(self.at):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _pending_pages(url: str) -> set[int]:
    return {int(p) for (p,) in rows(url, "SELECT id FROM pages WHERE status <> 'done'")}  # type: ignore[arg-type]


def test_chaos_on_a_fleet_started_as_the_readme_says_loses_nothing(
    pg_url: str,
    private_redis: RedisServer,
    s3_bucket: str,
    moto_endpoint: str,
    tmp_path: Path,
    workers_factory: list[Workers],
) -> None:
    """`ocrfleet worker --queues ingest` and `ocrfleet worker --queues gpu --devices cpu:2`,
    nothing else (no `ocrfleet beat`), default time limits and visibility timeout (an hour).
    One after another, each with work queued: a pool process SIGKILLed mid-page, a main
    process SIGKILLed mid-page, the ingest worker SIGKILLed mid-ingest, Redis SIGKILLed and
    started again without its data, every database connection cut. Every document ends
    `done`, every row is written once; the seconds from each fault until the last page it
    hit was done are printed (the note's numbers)."""
    env = {
        key: value
        for key, value in _env(pg_url, private_redis.url, s3_bucket, moto_endpoint).items()
        if key not in ("OCRFLEET_TASK_SOFT_TIME_LIMIT", "OCRFLEET_TASK_TIME_LIMIT")
        and key != "OCRFLEET_VISIBILITY_TIMEOUT"
    }
    settings = settings_from(env)
    url, broker = env["OCRFLEET_DATABASE_URL"], env["OCRFLEET_BROKER_URL"]
    workers_factory.append(start_workers(env, tmp_path / "ingest.log", queues="ingest"))
    gpu = start_workers(env, tmp_path / "gpu.log", queues="gpu", devices="cpu:2")
    workers_factory.append(gpu)
    done = DoneTimes(url)
    recovery: dict[str, float] = {}
    ids: list[int] = []
    seed = iter(range(400, 500))

    def submit(documents: int, pages: int) -> list[int]:
        new = [
            client.submit(make_document(next(seed), pages), settings=settings)
            for _ in range(documents)
        ]
        ids.extend(new)
        return new

    def settle(fault: str, hit: set[int], at: float) -> None:
        """Wait until every page `hit` by the fault is done; record the slowest."""
        wait_finished(ids, settings, 900, gpu)
        assert hit, f"{fault}: it hit no page"
        assert done.seen(hit), f"{fault}: pages never seen done: {hit - set(done.at)}"
        recovery[fault] = max(done.at[page] for page in hit) - at

    def kill_mid_page(which: str) -> tuple[set[int], float]:
        """SIGKILL the main process (or its pool process) of a device worker running a
        page; returns the pages it held that were not done yet, and when. Pages shorter
        than the heartbeat's period can all be done before one is seen started: then
        another document is submitted, until one is."""
        deadline = time.monotonic() + 600
        while (record := _busy_device_worker(broker)) is None:
            assert time.monotonic() < deadline, "no device worker ever ran a page"
            if not rows(url, "SELECT id FROM documents WHERE status <> 'done'"):
                submit(1, 2)
            time.sleep(0.1)
        victim = record["pid"] if which == "main" else _pool_children(record["pid"])[0]
        os.kill(victim, signal.SIGKILL)
        at = time.monotonic()
        held = {int(h["args"][0]) for h in record["held"] if h["task"] == PAGE_TASK}
        return held - set(done.at), at

    try:
        # A pool process killed mid-page with a backlog of pages behind it.
        submit(10, 3)
        wait_until(lambda: queue_depths(broker)["gpu"] >= 20, 600, "a backlog of pages")
        hit, at = kill_mid_page("pool")
        settle("pool process", hit or _pending_pages(url), at)

        # A main process killed mid-page: its messages are orphaned in `unacked`.
        submit(4, 2)
        hit, at = kill_mid_page("main")
        settle("main process", hit or _pending_pages(url), at)

        # The ingest worker killed mid-ingest: its document's pages come from the requeue.
        # (An ingest takes a fifth of a second, too short to see in a heartbeat: kill the
        # worker just after a burst of submits, while it holds their messages.)
        (ingest,) = [r for r in _heartbeats(broker) if r["hostname"].startswith("ingest@")]
        new = submit(6, 2)
        time.sleep(0.3)
        os.kill(ingest["pid"], signal.SIGKILL)
        at = time.monotonic()
        wait_finished(ids, settings, 900, gpu)
        settle("ingest worker", _pages_of(url, new), at)

        # Redis SIGKILLed and started again with nothing: every queued message is gone.
        submit(4, 2)
        wait_until(lambda: queue_depths(broker)["gpu"] >= 3, 600, "queued pages")
        hit = _pending_pages(url)
        private_redis.kill()
        at = time.monotonic()
        private_redis.wipe()
        private_redis.start()
        settle("redis data loss", hit, at)
        logs = (tmp_path / "gpu.log").read_text() + (tmp_path / "ingest.log").read_text()
        assert "the broker lost its data" in logs  # swept at once, not after the age limit

        # Every database connection cut, again and again for ~4 s, pages in flight.
        submit(4, 2)
        wait_until(lambda: queue_depths(broker)["gpu"] >= 3, 600, "queued pages")
        hit = _pending_pages(url)
        at = time.monotonic()
        database = pg_url.rsplit("/", 1)[1]
        cut = 0
        for _ in range(25):
            cut += cut_connections(database)
            time.sleep(0.15)
        assert cut > 0
        settle("database cuts", hit, at)
    finally:
        done.stop()
        for fault, seconds in recovery.items():
            print(f"chaos: {fault}: its last page done {seconds:.1f}s after the fault")

    states = [client.status(doc_id, settings=settings) for doc_id in ids]
    assert [s.status.value for s in states] == ["done"] * len(ids), [s.reason for s in states]
    assert_written_once(url)
    assert len(recovery) == 5
    for workers in workers_factory:
        assert workers.proc.poll() is None, "a fault took a launcher down"


def _pages_of(url: str, documents: list[int]) -> set[int]:
    query = "SELECT id FROM pages WHERE document_id = ANY(:docs)"
    return {int(p) for (p,) in rows(url, query, docs=documents)}  # type: ignore[arg-type]
