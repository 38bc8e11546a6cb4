"""One run identity across installs: an upload service installed without the models extra
(no torch, no transformers) submits to workers installed with it, and both compute one
run. Work of another run is left for a worker of that run, never failed."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from ocrfleet import ir
from tests import client_venv
from tests.conftest import REPO, free_port
from tests.integration.fleet_helpers import (
    Workers,
    make_document,
    process_env,
    rows,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration

# What an upload service runs: submit files, say which run they went under and whether the
# model libraries are importable here.
SUBMIT = """
import importlib.util, json, sys
from ocrfleet import client
from ocrfleet.config import Settings
settings = Settings()
ids = [client.submit(open(path, "rb").read(), settings=settings) for path in sys.argv[1:]]
found = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is not None]
print(json.dumps({"ids": ids, "run_id": client._run(settings)[0], "model_libraries": found}))
"""


@pytest.fixture(scope="module")
def client_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return client_venv.build(tmp_path_factory.mktemp("client") / "venv")
    except client_venv.VenvUnavailable as exc:
        pytest.skip(f"no client-only venv can be built offline here: {exc}")


def submit_from(python: Path, env: dict[str, str], paths: list[Path]) -> dict:
    done = subprocess.run(
        [str(python), "-c", SUBMIT, *map(str, paths)],
        cwd=REPO,
        env=process_env(env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_for(condition: object, timeout: float, workers: Workers, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()  # type: ignore[operator]
        if value:
            return value
        assert workers.proc.poll() is None, f"the workers exited early:\n{workers.log_tail()}"
        time.sleep(0.5)
    raise AssertionError(f"{what} not seen after {timeout}s:\n{workers.log_tail()}")


def test_a_client_without_torch_and_workers_with_it_share_one_run(
    env: dict[str, str], tmp_path: Path, client_python: Path, started: list[Workers]
) -> None:
    inputs = []
    for doc in range(3):
        inputs.append(tmp_path / f"doc{doc}.pdf")
        inputs[-1].write_bytes(make_document(doc, 1 + doc % 2))
    health = free_port()
    workers = start_workers(
        {**env, "OCRFLEET_WORKER_HEALTH_PORT": str(health)},
        tmp_path / "workers.log",
        queues="gpu,ingest",
        devices="cpu:1",
    )
    started.append(workers)
    submitted = submit_from(client_python, env, inputs[:2])
    assert submitted["model_libraries"] == []  # the client really has no torch
    settings = settings_from(env)
    states = wait_finished(submitted["ids"], settings, timeout=600, workers=workers)
    assert [s.status for s in states] == [ir.DocumentStatus.done] * 2, [s.reason for s in states]
    url = env["OCRFLEET_DATABASE_URL"]
    # One run: the client's, the documents' and the one the worker registered and reads.
    assert rows(url, "SELECT id FROM runs") == [(submitted["run_id"],)]
    broker = redis.Redis.from_url(env["OCRFLEET_BROKER_URL"])
    ready = [json.loads(broker.get(key)) for key in broker.scan_iter("ocrfleet:ready:*")]
    assert {record["run_id"] for record in ready} == {submitted["run_id"]}

    # A document of another run (another DPI) waits for a worker of that run: not failed.
    other_env = {**env, "OCRFLEET_DPI": "120"}
    other = submit_from(client_python, other_env, inputs[2:])
    assert other["run_id"] != submitted["run_id"]
    (other_id,) = other["ids"]
    reason_sql = "SELECT status, reason FROM documents WHERE id = :id"

    def waiting() -> tuple | None:
        found = rows(url, reason_sql, id=other_id)[0]
        return found if (found[1] or "").startswith("waiting for a worker of run") else None

    status, reason = wait_for(waiting, 300, workers, "the waiting reason")  # type: ignore[misc]
    assert status == "pending" and other["run_id"][:12] in reason
    waits = json.loads(broker.hget("ocrfleet:runs:waiting", other["run_id"]))
    assert waits["left_by"] == submitted["run_id"]
    with urllib.request.urlopen(f"http://127.0.0.1:{health}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    left = f'ocrfleet_left_for_run_total{{run="{other["run_id"][:12]}",task="ingest"}}'
    assert left in metrics, metrics[-2000:]
    time.sleep(15)  # more than one RUN_WAIT_S: it was put back again, never failed
    assert rows(url, reason_sql, id=other_id)[0][0] == "pending"

    # A worker of that run takes it; the messages the first worker held are not lost.
    workers.stop()
    second = start_workers(other_env, tmp_path / "second.log", queues="gpu,ingest", devices="cpu:1")
    started.append(second)
    (state,) = wait_finished([other_id], settings_from(other_env), timeout=600, workers=second)
    assert state.status == ir.DocumentStatus.done, state.reason
    assert rows(url, reason_sql, id=other_id) == [("done", None)]
    assert sorted(rows(url, "SELECT id FROM runs")) == sorted(
        [(submitted["run_id"],), (other["run_id"],)]
    )


def test_an_unpinned_ingest_worker_without_the_models_stops_at_start(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    """It cannot compute the run its documents go under: it says so and how to pin it,
    instead of failing each document it would split (the launcher gives up after a few
    restarts)."""
    broken = {**env, "OCRFLEET_ENGINES": "minicpm"}  # and no OCRFLEET_MINICPM_MODEL_PATH
    workers = start_workers(broken, tmp_path / "ingest.log", queues="ingest", devices="cpu:1")
    started.append(workers)
    deadline = time.monotonic() + 120
    while "stopping this worker" not in workers.log_tail(20000) and time.monotonic() < deadline:
        time.sleep(0.5)
    log = workers.log_tail(20000)
    assert "cannot compute the run documents go under" in log, log
    assert "OCRFLEET_MINICPM_MODEL_PATH is not set" in log and "OCRFLEET_RUN_ID" in log, log
