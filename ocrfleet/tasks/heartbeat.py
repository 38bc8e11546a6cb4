"""Worker heartbeats in Redis: who is alive, what it holds, which run it serves.

Each worker's *main* process (the one that holds the broker connection and its unacked
messages) writes `ocrfleet:worker:<hostname>` every `heartbeat_interval_s`, with a time to
live of three periods. When that process dies, by SIGKILL, OOM or a host crash, the key
expires and the messages it held are recognisably orphaned: their delivery tags are in
Redis' `unacked` hash but in no live heartbeat (see `ocrfleet.tasks.sweeps`).

Each pool process, once its models are loaded, writes `ocrfleet:ready:<hostname>` with
the load time it measured (the policy's start-up cost of one worker) and its run. The
policy measures worker rates from pages, not from these records (`scheduler.rates`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
from typing import Any

import redis
from celery.signals import celeryd_init, worker_init, worker_process_init, worker_shutdown

from ocrfleet.config import Settings, get_settings
from ocrfleet.tasks.lifecycle import model_load_seconds, worker_run_id

log = logging.getLogger(__name__)

WORKER_PREFIX = "ocrfleet:worker:"
READY_PREFIX = "ocrfleet:ready:"
# Hash: run id -> JSON {"at": unix time, "left_by": run id}, the last time a worker of
# another run put back work of that run (`ocrfleet.tasks.tasks`). Work of a run with a
# recent entry here and no live worker whose ready record names it waits for nobody.
WAITING_KEY = "ocrfleet:runs:waiting"
TTL_PERIODS = 3

_state: dict[str, Any] = {"hostname": None, "queues": [], "thread": None}


def _settings() -> Settings:
    return _state.get("settings") or get_settings()


def worker_key(hostname: str) -> str:
    return f"{WORKER_PREFIX}{hostname}"


def ready_key(hostname: str) -> str:
    return f"{READY_PREFIX}{hostname}"


def _client() -> redis.Redis:
    url = _settings().broker_url
    if not url:
        raise RuntimeError("OCRFLEET_BROKER_URL is not set")
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def _held_requests() -> list[Any]:
    """Every request this worker holds a message for: reserved, running or waiting on a
    countdown (a retry's message stays unacknowledged until it runs)."""
    from celery.worker import state

    for _ in range(5):  # the consumer changes these sets under us: read again
        try:
            held = {id(r): r for r in list(state.reserved_requests)}
            held.update({id(r): r for r in list(state.active_requests)})
            held.update({id(r): r for r in list(state.scheduled_requests)})
            held.update({id(r): r for r in list(state.requests.values())})
            return list(held.values())
        except RuntimeError:
            time.sleep(0.01)
    raise RuntimeError("worker state kept changing while being read")


def _request_record(request: Any) -> dict[str, Any]:
    message = getattr(request, "message", None)
    delivery = getattr(request, "delivery_info", None) or {}
    return {
        "tag": getattr(message, "delivery_tag", None),
        "id": request.id,
        "task": request.task_name,
        "args": list(request.args or []) if isinstance(request.args, list | tuple) else [],
        "queue": delivery.get("routing_key"),
        "started": getattr(request, "time_start", None),
    }


class _Beat:
    """The heartbeat thread of one worker main process."""

    def __init__(self, hostname: str, queues: list[str], interval: float) -> None:
        self.hostname = hostname
        self.queues = queues
        self.interval = interval
        self.started_at = time.time()
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._conn = _client()

    def record(self) -> dict[str, Any]:
        held = _held_requests()
        return {
            "hostname": self.hostname,
            "pid": os.getpid(),
            "queues": self.queues,
            "started_at": self.started_at,
            "ts": time.time(),
            "held": [_request_record(r) for r in held],
        }

    def beat(self) -> None:
        record = self.record()
        ttl = max(1, int(self.interval * TTL_PERIODS + 0.999))
        self._conn.set(worker_key(self.hostname), json.dumps(record), ex=ttl)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception as exc:  # a broker outage must not end the heartbeat thread
                log.warning("heartbeat failed: %s", exc)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        if os.getpid() != self.pid:  # a forked pool process inherited this object
            return
        self._stop.set()
        with contextlib.suppress(Exception):
            self._conn.delete(worker_key(self.hostname))


def _on_celeryd_init(sender: Any = None, options: Any = None, **_: Any) -> None:
    _state["hostname"] = str(sender)
    queues = (options or {}).get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    _state["queues"] = [str(q).strip() for q in queues]


def _on_worker_init(**_: Any) -> None:
    """Start beating before the pool and the consumer start (main process only): a message
    taken while the pool process still loads its models is claimed from the start."""
    if _state["thread"] is not None or _state["hostname"] is None:
        return
    beat = _Beat(_state["hostname"], _state["queues"], _settings().heartbeat_interval_s)
    thread = threading.Thread(target=beat.run, name="ocrfleet-heartbeat", daemon=True)
    _state["thread"], _state["beat"] = thread, beat
    thread.start()
    atexit.register(beat.stop)


def _on_worker_shutdown(**_: Any) -> None:
    beat = _state.get("beat")
    if beat is not None:
        beat.stop()


def _on_worker_process_init(**_: Any) -> None:
    """In a pool child after its models loaded: publish the load time it measured and
    the run it reads pages of (`run_id`, None for a worker that loads no models)."""
    hostname = _state["hostname"]
    if hostname is None:
        return
    record = {
        "pid": os.getpid(),
        "load_s": model_load_seconds(),
        "ready_at": time.time(),
        "run_id": worker_run_id(),
    }
    try:
        conn = _client()
        conn.set(ready_key(hostname), json.dumps(record), ex=7 * 24 * 3600)
        conn.close()
    except Exception as exc:
        log.warning("cannot publish the model load time: %s", exc)


def note_waiting(run_id: str, left_by: str) -> None:
    """Record that work of `run_id` was put back by a worker of `left_by` (WAITING_KEY)."""
    conn = _client()
    try:
        conn.hset(WAITING_KEY, run_id, json.dumps({"at": time.time(), "left_by": left_by}))
    finally:
        conn.close()


def connect(settings: Settings) -> None:
    """Connect the worker-side handlers (idempotent)."""
    _state["settings"] = settings
    celeryd_init.connect(_on_celeryd_init, weak=False, dispatch_uid="ocrfleet.hb.celeryd_init")
    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="ocrfleet.hb.worker_init")
    worker_shutdown.connect(
        _on_worker_shutdown, weak=False, dispatch_uid="ocrfleet.hb.worker_shutdown"
    )
    worker_process_init.connect(
        _on_worker_process_init, weak=False, dispatch_uid="ocrfleet.hb.worker_process_init"
    )
