"""The scheduler against the real fleet: signals read from Redis as kombu lays messages out,
and the local actuator starting and stopping real per-device workers through the
launcher's control channel."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from ocrfleet import client
from ocrfleet.scheduler.signals import queue_signals, worker_signals
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import create_app
from ocrfleet.tasks.control import desired_key, launcher_key
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


def _gpu_decisions(url: str) -> list[dict[str, Any]]:
    found = rows(
        url,
        "SELECT decided_at, current, desired, reason, inputs FROM scaling_decisions "
        "WHERE role = 'gpu' AND applied ORDER BY id",
    )
    keys = ("at", "current", "desired", "reason", "inputs")
    return [dict(zip(keys, row, strict=True)) for row in found]


def _to_the_minimum_after(decisions: list[dict[str, Any]], drained: datetime) -> dict[str, Any]:
    """The decision that took the pool to zero after `drained`, checked against the bound:
    idle from the first tick that saw no backlog, and to the minimum on the first tick the
    idle wait allowed."""
    after = [d for d in decisions if d["at"] > drained]
    (to_min,) = [d for d in after if d["current"] > 0 and d["desired"] == 0][-1:]
    assert to_min["reason"].startswith("idle"), to_min
    idle_since = to_min["at"] - timedelta(seconds=to_min["inputs"]["idle_for_s"] + 0.01)
    busy = [d for d in after if d["at"] < idle_since]
    assert all(sum(d["inputs"]["backlog"].values()) > 0 for d in busy), busy
    held = [d for d in after if idle_since <= d["at"] < to_min["at"]]
    assert held and all(d["inputs"]["idle_for_s"] < d["inputs"]["idle_wait_s"] for d in held)
    assert to_min["inputs"]["idle_for_s"] >= to_min["inputs"]["idle_wait_s"]
    return to_min


def test_a_burst_scales_up_drains_and_reaches_the_minimum_within_the_bound(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    """20 pages with the local actuator and real workers: up to the device cap, drained,
    then to zero on the first tick the idle wait allows; a cancel mid-run closes the
    pending pages, the backlog is 0 and the pool goes back to zero the same way."""
    env = {
        **env,
        "OCRFLEET_SCALE_MIN_GPU": "0",
        "OCRFLEET_SCALE_MAX_GPU": "2",
        "OCRFLEET_SCALE_DEFAULT_RATE": "0.05",  # a CPU page here: up to the cap at once
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

    # 20 pages queued, no page worker: an ingest worker splits 4 five-page documents.
    ids = [client.submit(make_document(700 + i, 5), settings=settings) for i in range(4)]
    splitter = start_workers(env, tmp_path / "ingest.log", queues="ingest", concurrency=1)
    started.append(splitter)
    eventually(lambda: queue_depths(broker)["gpu"] == 20, 120, "20 queued pages", splitter.log_tail)

    launcher = start_workers(
        env,
        tmp_path / "pages.log",
        queues="gpu",
        devices="cpu:2",
        extra=["--scaled", "--control-name", "test-launcher"],
    )
    started.append(launcher)
    eventually(lambda: conn.exists(launcher_key("test-launcher")), 60, "the launcher")
    # Without --actuator the scheduler only reports, for both pools, and changes nothing;
    # --help says so.
    usage = " ".join(ocrfleet_cli(env, "scheduler", "--help").split())
    assert "[default: (none: report what it would set, change nothing)]" in usage
    report = ocrfleet_cli(env, "scheduler", "--once", "--json")
    reported = {d["role"]: d for d in map(json.loads, report.splitlines())}
    assert set(reported) == {"gpu", "ingest"}
    assert not any(d["applied"] for d in reported.values())
    assert reported["gpu"]["inputs"]["backlog"]["normal"] == 20
    assert reported["gpu"]["desired"] >= 1 and "up:" in reported["gpu"]["reason"]
    # --dry-run with the local actuator: what it would tell the launcher, not told.
    dry = ocrfleet_cli(env, "scheduler", "--dry-run", "--actuator", "local", "--json")
    (would,) = [json.loads(line) for line in dry.splitlines()]
    assert (would["role"], would["desired"], would["applied"]) == ("gpu", 2, False)
    time.sleep(2)
    assert conn.get(desired_key("test-launcher")) in (None, b"0")
    assert children_of(launcher.proc.pid) == []  # a scaled launcher starts with none
    actions = rows(url, "SELECT count(*) FROM scaling_decisions WHERE applied")
    assert actions == [(0,)]

    log = open(tmp_path / "scheduler.log", "ab")  # noqa: SIM115 - closed below
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "ocrfleet.cli", "scheduler", "--actuator", "local"],
        cwd=REPO,
        env=process_env(env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    scheduler_tail = lambda: (tmp_path / "scheduler.log").read_text()[-3000:]  # noqa: E731

    def at_zero() -> bool:
        return (
            conn.get(desired_key("test-launcher")) == b"0"
            and not children_of(launcher.proc.pid)
            and not [w for w in worker_signals(conn) if w.role == "gpu"]
        )

    try:
        most = 0
        deadline = time.monotonic() + 300
        while not all(s.finished for s in (client.status(i, settings=settings) for i in ids)):
            most = max(most, len([w for w in worker_signals(conn) if w.role == "gpu"]))
            assert time.monotonic() < deadline, launcher.log_tail()
            time.sleep(0.3)
        assert most == 2  # the device cap, reached
        eventually(
            at_zero, 90, "the scale-down to zero", lambda: scheduler_tail() + launcher.log_tail()
        )
        at_zero_after_burst = datetime.now(UTC)
        ((drained,),) = rows(url, "SELECT max(updated_at) FROM pages")
        to_min = _to_the_minimum_after(_gpu_decisions(url), drained)
        wait = to_min["inputs"]["idle_wait_s"]
        print(
            f"real burst: 20 pages drained, to the minimum decided "
            f"{(to_min['at'] - drained).total_seconds():.1f}s and no worker left "
            f"{(at_zero_after_burst - drained).total_seconds():.1f}s after the last page "
            f"(bound: idle {wait:.1f}s + 2 ticks = {wait + 2:.1f}s, plus the workers' stop)"
        )
        port = env["OCRFLEET_SCHEDULER_METRICS_PORT"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
        assert 'ocrfleet_scheduler_desired_workers{role="gpu"} 0.0' in metrics
        assert 'ocrfleet_scheduler_worker_rate{role="gpu"}' in metrics

        states = wait_finished(ids, settings, 10)
        assert [s.status.value for s in states] == ["done"] * 4
        assert_written_once(url)
        assert rows(url, "SELECT count(*) FROM pages WHERE status = 'done'") == [(20,)]
        assert set(queue_depths(broker).values()) == {0}

        # A cancel mid-run: 4 more documents, cancelled once the pool is up and a page of
        # them is done. Their pending pages close, the backlog is 0, the pool shrinks.
        more = [client.submit(make_document(800 + i, 5), settings=settings) for i in range(4)]
        eventually(
            lambda: rows(url, "SELECT count(*) FROM pages WHERE status = 'done'")[0][0] > 20,
            180,
            "a page of the second batch",
            lambda: scheduler_tail() + splitter.log_tail() + launcher.log_tail(),
        )
        cancelled_at = datetime.now(UTC)
        ((pages_done_at_cancel,),) = rows(url, "SELECT count(*) FROM pages WHERE status = 'done'")
        for doc_id in more:
            client.cancel(doc_id, settings=settings)
        eventually(at_zero, 120, "the scale-down after the cancel", scheduler_tail)
        at_zero_after_cancel = datetime.now(UTC)
        assert {client.status(i, settings=settings).status.value for i in more} == {"cancelled"}
        pending = rows(
            url,
            "SELECT count(*) FROM pages WHERE status = 'pending' AND document_id IN "
            f"({','.join(map(str, more))})",
        )
        assert pending == [(0,)]
        # Drained when the pages running at the cancel finished: zero within the bound too.
        ((drained,),) = rows(url, "SELECT max(updated_at) FROM pages")
        to_min = _to_the_minimum_after(_gpu_decisions(url), max(drained, cancelled_at))
        wait = to_min["inputs"]["idle_wait_s"]
        print(
            f"cancel mid-run: {pages_done_at_cancel - 20} page(s) of 20 done; the last running "
            f"page finished {(drained - cancelled_at).total_seconds():.1f}s after the cancel, "
            f"to the minimum decided {(to_min['at'] - cancelled_at).total_seconds():.1f}s and "
            f"no worker left {(at_zero_after_cancel - cancelled_at).total_seconds():.1f}s "
            f"after it (bound after the drain: idle {wait:.1f}s + 2 ticks)"
        )
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)
        log.close()

    # Every decision was stored with its inputs; the sizes went 0 -> 2 -> ... -> 0, twice.
    changes = rows(
        url,
        "SELECT current, desired, reason FROM scaling_decisions "
        "WHERE role = 'gpu' AND applied AND current <> desired ORDER BY id",
    )
    assert changes[0][:2] == (0, 2) and changes[0][2].startswith("up:")
    assert changes[-1][1] == 0
    assert all(b[0] == a[1] for a, b in zip(changes, changes[1:], strict=False))
    # Once workers ran, the policy used rates it measured and their start-up, not defaults.
    ((measured,),) = rows(
        url,
        "SELECT count(*) FROM scaling_decisions WHERE role = 'gpu' "
        "AND (inputs->>'rate_measured')::boolean AND (inputs->>'startup_measured')::boolean",
    )
    assert measured > 0
    # ... from pages the workers' heartbeats showed running (busy time), not guessed.
    assert any(d["inputs"]["running"] > 0 for d in _gpu_decisions(url))
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
