"""`ocrfleet worker --devices 0,1` on a machine without GPUs: the real launcher starting the
real Celery workers. Each child sees exactly its one device, a crashed child comes back on
the same device, and SIGTERM drains: the page in flight finishes, unstarted pages stay
queued and are done by the next workers."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from ocrfleet import client
from ocrfleet.memory import HUGE_PAGES
from ocrfleet.tasks.app import create_app
from tests.integration.fleet_helpers import (
    Workers,
    children_of,
    descendants,
    environ_of,
    make_document,
    queue_depths,
    rows,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")


def eventually(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def pinned_children(launcher_pid: int) -> dict[str, int]:
    """CUDA_VISIBLE_DEVICES -> pid of each worker the launcher started."""
    found = {}
    for pid in children_of(launcher_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"celery" not in cmdline:
                continue  # forked, not yet exec'd: still the launcher's environment
            if b"webhooks@" in cmdline:
                continue  # the webhook deliveries' child: no device
            found[environ_of(pid).get("CUDA_VISIBLE_DEVICES", "<unset>")] = pid
        except OSError:
            continue  # exited meanwhile
    return found


def living_environs(pids: list[int]) -> dict[int, dict[str, str]]:
    """The environment of each of `pids` still running: a short-lived child (a model
    loader's subprocess) may exit between the listing and the read."""
    found = {}
    for pid in pids:
        try:
            found[pid] = environ_of(pid)
        except OSError:
            continue
    return found


def test_launcher_pins_restarts_and_drains(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    settings = settings_from(env)
    workers = start_workers(env, tmp_path / "workers.log", queues="gpu,ingest", devices="0,1")
    started.append(workers)
    launcher = workers.proc.pid

    # One worker per device, each seeing exactly its own, pool processes included.
    def two_workers() -> dict[str, int] | None:
        found = pinned_children(launcher)
        return found if len(found) == 2 else None

    pinned = eventually(two_workers, 60, "two workers")
    assert sorted(pinned) == ["0", "1"]
    for device, pid in pinned.items():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert f"gpu{device}@%h".encode() in cmdline
        pool = eventually(
            lambda pid=pid: living_environs(descendants(pid)), 120, f"the pool of gpu{device}"
        )
        assert {env["CUDA_VISIBLE_DEVICES"] for env in pool.values()} == {device}
        # glibc reads its tunables at start: the worker runs the models on huge pages.
        tunables = {e.get("GLIBC_TUNABLES", "") for e in [environ_of(pid), *pool.values()]}
        assert all(HUGE_PAGES in t for t in tunables), tunables
    app = create_app(settings)
    host = socket.gethostname()
    eventually(
        lambda: (
            {f"gpu0@{host}", f"gpu1@{host}"}
            <= {name for reply in app.control.ping(timeout=1.0) for name in reply}
        ),
        120,
        "both workers to answer a ping by device name",
    )

    # A crashed worker is started again, on the same device.
    crashed = pinned["1"]
    os.kill(crashed, signal.SIGKILL)

    def gpu1_restarted() -> dict[str, int] | None:
        found = pinned_children(launcher)
        return found if found.get("1") not in (None, crashed) else None

    restarted = eventually(gpu1_restarted, 60, "gpu1 to be restarted")
    assert sorted(restarted) == ["0", "1"] and restarted["0"] == pinned["0"]
    assert "worker gpu1 exited with -9" in workers.log_tail(20000)

    # SIGTERM while a page is in flight: it finishes, the rest wait in the queue.
    doc = client.submit(make_document(700, 8), settings=settings)
    url = env["OCRFLEET_DATABASE_URL"]
    in_flight = eventually(
        lambda: rows(
            url,
            "SELECT id FROM pages WHERE document_id = :d AND status = 'pending' AND deliveries > 0",
            d=doc,
        ),
        300,
        "a page in flight",
    )
    workers.proc.send_signal(signal.SIGTERM)
    assert workers.proc.wait(timeout=120) == 0, workers.log_tail()
    assert descendants(launcher) == []

    pages = rows(url, "SELECT id, status, deliveries FROM pages WHERE document_id = :d", d=doc)
    started_pages = {pid: status for pid, status, deliveries in pages if deliveries > 0}
    assert {pid for (pid,) in in_flight} <= set(started_pages)
    assert set(started_pages.values()) == {"done"}, pages  # nothing abandoned half-way
    waiting = [pid for pid, status, _ in pages if status == "pending"]
    assert waiting, "every page finished before SIGTERM: nothing was left to drain"
    depths = queue_depths(env["OCRFLEET_BROKER_URL"])
    assert depths["gpu"] == len(waiting) and depths["unacked"] == 0, depths

    # The next workers take the unstarted pages from the queue and finish the document.
    again = start_workers(env, tmp_path / "again.log", queues="gpu,ingest", devices="cpu:1")
    started.append(again)
    (state,) = wait_finished([doc], settings, 300, again)
    assert state.status.value == "done"
    assert rows(url, "SELECT DISTINCT deliveries FROM pages WHERE document_id = :d", d=doc) == [
        (1,)
    ]
