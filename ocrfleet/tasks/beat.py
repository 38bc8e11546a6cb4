"""Celery beat with a Redis lock: start a beat on every host, exactly one sends.

The beat holding `ocrfleet:beat:lock` (a token with a time to live, renewed every tick)
sends the sweeps; the others tick idly and take over within the lock's time to live when
the holder dies. Beat wakes at least every `beat_max_loop_interval` seconds (see
`ocrfleet.tasks.app`), well inside the time to live.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

import redis
from celery.beat import PersistentScheduler

log = logging.getLogger(__name__)

LOCK_KEY = "ocrfleet:beat:lock"
LOCK_TTL_S = 30
STANDBY_SLEEP_S = 5.0

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


class LockedScheduler(PersistentScheduler):
    """A PersistentScheduler (state in the schedule file) that only sends while it holds
    the fleet's beat lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token = uuid.uuid4().hex
        self._redis = redis.Redis.from_url(
            self.app.conf.broker_url, socket_timeout=5, socket_connect_timeout=5
        )
        self._held = False

    def _hold(self) -> bool:
        try:
            return bool(self._redis.eval(_RENEW, 1, LOCK_KEY, self._token, LOCK_TTL_S))
        except redis.RedisError as exc:
            log.warning("beat lock unreachable: %s", exc)
            return False

    def tick(self, *args: Any, **kwargs: Any) -> float:
        held = self._hold()
        if held != self._held:
            log.info("beat lock %s", "acquired: sending sweeps" if held else "lost: standing by")
            self._held = held
        if not held:
            return STANDBY_SLEEP_S
        return min(float(super().tick(*args, **kwargs)), STANDBY_SLEEP_S)

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self._redis.eval(_RELEASE, 1, LOCK_KEY, self._token)
        super().close()
