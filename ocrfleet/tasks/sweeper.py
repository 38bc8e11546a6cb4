"""Recovery without a process of its own: the sweeps run wherever a fleet runs.

Every `ocrfleet worker` launcher runs a `Sweeper` thread, and so does `ocrfleet scheduler`
(`ocrfleet beat` runs one alone, for a host that wants it apart). They elect one among
themselves with the Redis lock `ocrfleet:beat:lock` (a token with a time to live, renewed
every tick): the holder runs each sweep of `ocrfleet.tasks.sweeps` when it is due, the others
stand by and take over within the lock's time to live when the holder dies. When each sweep
last ran is kept in Redis too, so a new holder does not run them all again at once.

A Redis that lost its data (restarted without its append-only file) loses the lock, the
queues and the marker `ocrfleet:broker:epoch` together. A sweeper that saw the marker and
finds it gone runs the lost-work sweep with no age limit as soon as the workers have
heartbeaten again (`LOSS_WAIT_PERIODS`: their heartbeats name the pages in their hands, and
kombu has put back what they had reserved): every pending page and document with no message
left is enqueued again seconds after the broker's return, instead of after
`OCRFLEET_SWEEP_LOST_AFTER_S`, and a page in a worker's hands is not sent twice.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import Any

import redis

from ocrfleet.config import Settings

log = logging.getLogger(__name__)

LOCK_KEY = "ocrfleet:beat:lock"
LAST_RUN_PREFIX = "ocrfleet:sweep:last:"
EPOCH_KEY = "ocrfleet:broker:epoch"
LOCK_TTL_S = 30
TICK_S = 5.0
LOSS_WAIT_PERIODS = 2  # heartbeats to wait after a data loss before re-sending lost work

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) and 1 or 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def periods(settings: Settings) -> dict[str, float]:
    """Each sweep's period in seconds."""
    every = {
        "orphans": settings.sweep_interval_s,
        "lost": max(settings.sweep_interval_s, 60.0),
        "retention": 3600.0,
    }
    if settings.intake_prefix:
        every["intake"] = max(settings.sweep_interval_s, 60.0)
    return every


def _did_something(outcome: Any) -> bool:
    if isinstance(outcome, dict):
        return any(outcome.values())
    return bool(outcome)


class Sweeper:
    """One candidate for running the fleet's sweeps; `run` blocks, `start` runs it in a
    daemon thread."""

    def __init__(self, settings: Settings, *, tick_s: float = TICK_S) -> None:
        if not settings.broker_url:
            raise ValueError("OCRFLEET_BROKER_URL is not set: the sweeps need the broker")
        self.settings = settings
        self.tick_s = tick_s
        self.periods = periods(settings)
        self.held = False
        self._token = uuid.uuid4().hex
        self._saw_epoch = False
        self._lost_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn = redis.Redis.from_url(
            settings.broker_url, socket_timeout=10, socket_connect_timeout=5
        )

    def _hold(self) -> bool:
        held = bool(self._conn.eval(_RENEW, 1, LOCK_KEY, self._token, LOCK_TTL_S))
        if held != self.held:
            log.info("sweep lock %s", "acquired: running the sweeps" if held else "lost")
            self.held = held
        return held

    def _broker_lost_its_data(self, holder: bool) -> bool:
        """Whether the epoch marker this sweeper saw is gone. Only the lock's holder sets it
        (again): a standby that did could hide the loss from a holder about to look."""
        if self._conn.exists(EPOCH_KEY):
            self._saw_epoch = True
            return False
        if not holder:
            return False
        lost = self._saw_epoch
        self._conn.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
        self._saw_epoch = True
        return lost

    def due(self, now: float) -> list[str]:
        names = list(self.periods)
        lasts = self._conn.mget([LAST_RUN_PREFIX + name for name in names])
        return [
            name
            for name, last in zip(names, lasts, strict=True)
            if last is None or now - float(last) >= self.periods[name]
        ]

    def tick(self, now: float | None = None) -> dict[str, Any]:
        """Run what is due if this sweeper holds the lock; returns each sweep's outcome."""
        from ocrfleet.tasks.sweeps import requeue_lost, run_sweep

        now = time.time() if now is None else now
        if not self._hold():
            self._broker_lost_its_data(holder=False)  # remember the marker, to notice its loss
            return {}
        outcomes: dict[str, Any] = {}
        if self._broker_lost_its_data(holder=True):
            log.warning("the broker lost its data: re-sending lost work after a heartbeat")
            self._lost_at = now
        wait = LOSS_WAIT_PERIODS * self.settings.heartbeat_interval_s
        if self._lost_at is not None and now - self._lost_at >= wait:
            outcomes["lost"] = requeue_lost(self.settings, lost_after_s=0.0)
            log.warning("the broker lost its data; re-sent: %s", outcomes["lost"])
            self._lost_at = None
            self._conn.set(LAST_RUN_PREFIX + "lost", now)
        for name in self.due(now):
            if not self._hold():  # a long sweep outlived the lock: another sweeper has it
                break
            try:
                outcomes[name] = run_sweep(name, self.settings)
            except Exception as exc:  # one failing sweep must not stop the others
                log.warning("sweep %s failed: %s", name, exc)
                continue
            self._conn.set(LAST_RUN_PREFIX + name, now)
            if _did_something(outcomes[name]):
                log.info("sweep %s: %s", name, outcomes[name])
        return outcomes

    def run(self) -> None:
        """Tick until `stop`; a broker outage only skips ticks."""
        while not self._stop.is_set():
            try:
                self.tick()
            except redis.RedisError as exc:
                self.held = False
                log.warning("sweeps skipped, broker unreachable: %s", exc)
            except Exception:
                log.exception("sweep tick failed")
            self._stop.wait(self.tick_s)

    def start(self) -> Sweeper:
        self._thread = threading.Thread(target=self.run, name="ocrfleet-sweeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop ticking and hand the lock over at once."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with contextlib.suppress(redis.RedisError):
            self._conn.eval(_RELEASE, 1, LOCK_KEY, self._token)
        self._conn.close()
