"""The scheduler against the real fleet: signals read from Redis as kombu lays messages out,
and the local actuator starting and stopping real per-device workers through the
launcher's control channel."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ocrfleet import client
from ocrfleet.scheduler.signals import queue_signals, worker_signals
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import create_app
from ocrfleet.tasks.control import desired_key
from tests.conftest import REPO, free_port
from tests.integration.fleet_helpers import (
    Workers,
    assert_written_once,
    children_of,
    make_document,
    ocrfleet_cli,
    process_env,
    queue_depths,
    rows,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def started() -> Iterator[list[Workers]]:
    launched: list[Workers] = []
    yield launched
    for workers in launched:
        workers.stop()


def eventually(probe, timeout: float, what: str, tail=lambda: ""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail()}")
        time.sleep(0.2)


def test_signals_count_priority_sub_lists_and_unacked_messages(env: dict[str, str]) -> None:
    settings = settings_from(env)
    app = create_app(settings)
    for page_id in range(3):
        app.send_task(routing.PAGE_TASK, args=[page_id], queue="gpu")
    # A message with a priority lands in a sub-list, `gpu\x06\x163`, not in `gpu`.
    app.send_task(routing.PAGE_TASK, args=[99], queue="gpu", priority=5)
    app.send_task(routing.INGEST_TASK, args=["s3://b/k"], queue="ingest.high")
    conn = redis.Redis.from_url(env["OCRFLEET_BROKER_URL"])
    assert conn.llen("gpu") == 3 and conn.llen("gpu\x06\x163") == 1

    signals = queue_signals(conn)
    assert (signals["gpu"].waiting, signals["gpu"].unacked) == (4, 0)
    assert (signals["ingest.high"].waiting, signals["ingest"].waiting) == (1, 0)

    # A consumer that took a message without acknowledging it (acks_late): the list
    # shrinks, the unacked hash holds it, and the signal still counts it.
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue("gpu")
        message = queue.get(timeout=5)
        signals = queue_signals(conn)
        assert (signals["gpu"].waiting, signals["gpu"].unacked) == (3, 1)
        message.ack()
        queue.close()
    assert queue_signals(conn)["gpu"].unacked == 0


def test_scheduler_scales_up_drains_the_backlog_and_scales_back(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    env = {
        **env,
        "OCRFLEET_SCALE_MIN_GPU": "0",
        "OCRFLEET_SCALE_MAX_GPU": "2",
        "OCRFLEET_SCALE_INTERVAL_S": "1",
        "OCRFLEET_SCALE_DOWN_COOLDOWN_S": "4",
        "OCRFLEET_SCALE_MIN_IDLE_S": "3",
        "OCRFLEET_SCALE_IDLE_LOADS": "1",
        "OCRFLEET_SLO_NORMAL_S": "60",
        "OCRFLEET_HEARTBEAT_INTERVAL_S": "1",
        "OCRFLEET_SCHEDULER_METRICS_PORT": str(free_port()),
    }
    settings = settings_from(env)
    broker = env["OCRFLEET_BROKER_URL"]
    url = env["OCRFLEET_DATABASE_URL"]
    conn = redis.Redis.from_url(broker)

    # 50 pages queued, no page worker: an ingest worker splits 10 five-page documents.
    ids = [client.submit(make_document(700 + i, 5), settings=settings) for i in range(10)]
    splitter = start_workers(env, tmp_path / "ingest.log", queues="ingest", concurrency=1)
    started.append(splitter)
    eventually(lambda: queue_depths(broker)["gpu"] == 50, 120, "50 queued pages", splitter.log_tail)
    splitter.stop()

    # What the policy would do, changing nothing.
    dry = ocrfleet_cli(env, "scheduler", "--dry-run", "--actuator", "local", "--json")
    (would,) = [json.loads(line) for line in dry.splitlines()]
    assert would["inputs"]["backlog"]["normal"] == 50 and would["applied"] is False
    assert would["desired"] == 0 and "capped at 0" in would["reason"]  # no launcher yet

    launcher = start_workers(
        env,
        tmp_path / "pages.log",
        queues="gpu",
        devices="cpu:2",
        extra=["--scaled", "--control-name", "test-launcher"],
    )
    started.append(launcher)
    time.sleep(2)
    assert children_of(launcher.proc.pid) == []  # a scaled launcher starts with none
    log = open(tmp_path / "scheduler.log", "ab")  # noqa: SIM115 - closed below
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "ocrfleet.cli", "scheduler", "--actuator", "local"],
        cwd=REPO,
        env=process_env(env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        most = 0
        deadline = time.monotonic() + 300
        while not all(s.finished for s in (client.status(i, settings=settings) for i in ids)):
            most = max(most, len(worker_signals(conn)))
            assert time.monotonic() < deadline, launcher.log_tail()
            time.sleep(0.3)
        assert most == 2  # the device cap, reached

        # Idle: back to the minimum, every worker stopped warm, none restarted.
        eventually(
            lambda: conn.get(desired_key("test-launcher")) == b"0"
            and not children_of(launcher.proc.pid)
            and not worker_signals(conn),
            90,
            "the scale-down to zero",
            lambda: (tmp_path / "scheduler.log").read_text()[-3000:] + launcher.log_tail(),
        )
        port = env["OCRFLEET_SCHEDULER_METRICS_PORT"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
        assert 'ocrfleet_scheduler_desired_workers{role="gpu"} 0.0' in metrics
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)
        log.close()

    states = wait_finished(ids, settings, 10)
    assert [s.status.value for s in states] == ["done"] * 10
    assert_written_once(url)
    assert rows(url, "SELECT count(*) FROM pages WHERE status = 'done'") == [(50,)]
    assert set(queue_depths(broker).values()) == {0}

    # Every decision was stored with its inputs; the sizes went 0 -> 2 -> ... -> 0.
    changes = rows(
        url,
        "SELECT current, desired, reason FROM scaling_decisions "
        "WHERE role = 'gpu' AND applied AND current <> desired ORDER BY id",
    )
    assert changes[0][:2] == (0, 2) and changes[0][2].startswith("up:")
    assert changes[-1][1] == 0
    assert all(b[0] == a[1] for a, b in zip(changes, changes[1:], strict=False))
    # Once workers ran, the policy used their own heartbeat numbers, not the defaults.
    ((measured,),) = rows(
        url,
        "SELECT count(*) FROM scaling_decisions WHERE role = 'gpu' "
        "AND (inputs->>'rate_measured')::boolean AND (inputs->>'startup_measured')::boolean",
    )
    assert measured > 0
    explained = ocrfleet_cli(env, "scheduler", "explain", "--changes", "--json")
    assert [(d["current"], d["desired"]) for d in json.loads(explained)][-1] == changes[0][:2]


def test_celery_actuator_grows_and_shrinks_an_ingest_pool(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    from ocrfleet.scheduler.actuators import CeleryPoolActuator

    splitter = start_workers(env, tmp_path / "ingest.log", queues="ingest", concurrency=1)
    started.append(splitter)
    actuator = CeleryPoolActuator(create_app(settings_from(env)), timeout=5)
    pools = eventually(actuator.pools, 120, "the ingest worker to answer", splitter.log_tail)
    assert list(pools.values()) == [1] and actuator.current() == 1
    actuator.apply(3)
    eventually(lambda: actuator.current() == 3, 60, "the pool to grow", splitter.log_tail)
    actuator.apply(0)  # never below one process per worker
    eventually(lambda: actuator.current() == 1, 60, "the pool to shrink", splitter.log_tail)
