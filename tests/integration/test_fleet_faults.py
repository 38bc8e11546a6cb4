"""Faults while pages are in flight: a worker killed mid-page, a page that kills its worker
every time, a Redis restart and PostgreSQL connections cut. Nothing is lost, nothing is
written twice."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from ocrfleet import client
from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.session import dispose_engines
from tests.conftest import PG_ADMIN_URL, free_port, wait_for_port
from tests.integration.fleet_helpers import (
    Workers,
    assert_written_once,
    fleet_env,
    make_document,
    make_pdf,
    page_lines,
    rows,
    running_beat,
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
        OCRFLEET_TASK_TIME_LIMIT="10",
        OCRFLEET_VISIBILITY_TIMEOUT="30",
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


def test_redis_restart_and_cut_database_connections_lose_nothing(
    pg_url: str,
    private_redis: RedisServer,
    s3_bucket: str,
    moto_endpoint: str,
    tmp_path: Path,
    workers_factory: list[Workers],
) -> None:
    # A message the broker had not yet written when it died is the lost-work sweep's to
    # re-send: the fleet runs its beat, as in production.
    env = {
        **_env(pg_url, private_redis.url, s3_bucket, moto_endpoint),
        "OCRFLEET_SWEEP_LOST_AFTER_S": "20",
    }
    settings = settings_from(env)
    url = env["OCRFLEET_DATABASE_URL"]
    workers = start_workers(env, tmp_path / "workers.log", devices="cpu:2")
    workers_factory.append(workers)
    with running_beat(env, tmp_path):
        _survive_faults(url, settings, private_redis, pg_url, workers)

def _survive_faults(
    url: str, settings: Settings, private_redis: RedisServer, pg_url: str, workers: Workers
) -> None:
    ids = [client.submit(make_document(300 + i, 3), settings=settings) for i in range(10)]
    wait_until(lambda: pages_done(url) >= 3, 300, "the first pages")
    before_restart = pages_done(url)
    assert before_restart < 30, "everything finished before the fault: nothing was in flight"

    private_redis.kill()
    time.sleep(2)
    private_redis.start()
    wait_until(lambda: pages_done(url) >= before_restart + 3, 300, "progress after the restart")

    database = pg_url.rsplit("/", 1)[1]
    assert pages_done(url) < 30, "everything finished before the cuts: nothing was in flight"
    cut = 0
    for _ in range(25):  # for ~4 s, cut whatever the workers hold, mid-transaction or idle
        cut += cut_connections(database)
        time.sleep(0.15)
    assert cut > 0

    states = wait_finished(ids, settings, 900, workers)
    assert [s.status.value for s in states] == ["done"] * 10, [s.reason for s in states]
    assert pages_done(url) == 30
    assert_written_once(url)
    assert workers.proc.poll() is None, "a fault took the launcher down"
