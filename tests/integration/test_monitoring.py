"""Monitoring against real Redis and a real worker. `ocrfleet flower` refuses to start
without credentials, answers 401 without them, and with them lists the worker, counts the
tasks that ran, and reports queue lengths that agree with the scheduler's own signal. The
worker's own endpoint answers /healthz, /readyz and /metrics from its pool process."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from ocrfleet import client
from ocrfleet.scheduler.signals import queue_signals
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import create_app
from tests.conftest import REPO, free_port, wait_for_port
from tests.integration.fleet_helpers import (
    Workers,
    make_document,
    process_env,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration

CREDENTIALS = "ops:correct-horse"


def get(url: str, auth: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_flower_needs_credentials_lists_workers_counts_tasks_and_queue_lengths(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    settings = settings_from(env)
    cli = [sys.executable, "-m", "ocrfleet.cli", "flower"]
    refused = subprocess.run(
        [*cli, "--port", str(free_port())],
        cwd=REPO,
        env=process_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "refuses to start without credentials" in refused.stderr

    port = free_port()
    flower_env = {
        **env,
        "OCRFLEET_FLOWER_BASIC_AUTH": CREDENTIALS,
        "OCRFLEET_FLOWER_DB": str(tmp_path / "flower.db"),
    }
    log = open(tmp_path / "flower.log", "ab")  # noqa: SIM115 - closed below
    flower = subprocess.Popen(
        [*cli, "--port", str(port), "--address", "127.0.0.1"],
        cwd=REPO,
        env=process_env(flower_env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_port(port, timeout=60)
        health_port = free_port()
        worker_env = {**env, "OCRFLEET_WORKER_HEALTH_PORT": str(health_port)}
        workers = start_workers(worker_env, tmp_path / "workers.log", devices="cpu:1", events=True)
        started.append(workers)
        ids = [client.submit(make_document(880 + i, 1), settings=settings) for i in range(2)]
        ids.append(client.submit(b"neither a PDF nor an image", settings=settings))
        wait_finished(ids, settings, 300, workers)

        # The worker's own endpoint (slot 0: the base port).
        health = f"http://127.0.0.1:{health_port}"
        assert get(f"{health}/healthz") == (200, '{"broker": true, "database": true}')
        assert get(f"{health}/readyz")[0] == 200
        exported = get(f"{health}/metrics")[1]
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in exported.splitlines()
            if line and not line.startswith("#")
        }
        assert samples['ocrfleet_pages_processed_total{status="done"}'] == 2.0
        assert samples['ocrfleet_stage_seconds_count{stage="page"}'] == 2.0
        assert samples['ocrfleet_stage_seconds_count{stage="queue_wait_page"}'] == 2.0
        assert samples['ocrfleet_stage_seconds_count{stage="ingest"}'] == 3.0
        assert samples['ocrfleet_rejections_total{reason="unsupported_type"}'] == 1.0
        assert samples["ocrfleet_regions_processed_total"] >= 2.0
        assert samples['ocrfleet_score_count{scorer="consensus"}'] >= 2.0
        for gauge in ("ocrfleet_model_load_seconds", "ocrfleet_device_memory_bytes"):
            assert any(k.startswith(gauge) and v > 0 for k, v in samples.items()), gauge

        assert get(f"{base}/api/workers")[0] == 401
        assert get(f"{base}/api/workers", "ops:wrong")[0] == 401
        deadline = time.monotonic() + 60
        while True:
            status, body = get(f"{base}/api/workers?refresh=1", CREDENTIALS)
            assert status == 200, body
            names = list(json.loads(body))
            if any(name.startswith("cpu0@") for name in names):
                break
            assert time.monotonic() < deadline, names
            time.sleep(1)

        # Three ingests and two pages ran; Flower saw each succeed (task events).
        def succeeded() -> dict[str, float]:
            counts: dict[str, float] = {}
            for line in get(f"{base}/metrics", CREDENTIALS)[1].splitlines():
                if line.startswith("flower_events_total{") and 'type="task-succeeded"' in line:
                    task = line.split('task="', 1)[1].split('"', 1)[0]
                    counts[task] = counts.get(task, 0) + float(line.rsplit(" ", 1)[1])
            return counts

        deadline = time.monotonic() + 30
        while succeeded().get(routing.PAGE_TASK, 0) < 2:
            assert time.monotonic() < deadline, succeeded()
            time.sleep(0.5)
        assert succeeded() == {routing.INGEST_TASK: 3.0, routing.PAGE_TASK: 2.0}

        # With the worker gone, messages wait; Flower and the scheduler count the same,
        # priority sub-lists included.
        workers.stop()
        app = create_app(settings)
        for i in range(3):
            client.submit(make_document(890 + i, 1), settings=settings)
        app.send_task(routing.PAGE_TASK, args=[10_000], queue="gpu", priority=6)
        app.send_task(routing.PAGE_TASK, args=[10_001], queue="gpu.high")
        status, body = get(f"{base}/api/queues/length", CREDENTIALS)
        assert status == 200, body
        flower_lengths = {q["name"]: q["messages"] for q in json.loads(body)["active_queues"]}
        ours = queue_signals(redis.Redis.from_url(env["OCRFLEET_BROKER_URL"]))
        assert {name: ours[name].waiting for name in ours} == {
            name: flower_lengths[name] for name in ours
        }
        assert (ours["ingest"].waiting, ours["gpu"].waiting, ours["gpu.high"].waiting) == (3, 1, 1)
    finally:
        flower.terminate()
        flower.wait(timeout=30)
        log.close()
    assert (tmp_path / "flower.db").exists() or list(tmp_path.glob("flower.db*"))
