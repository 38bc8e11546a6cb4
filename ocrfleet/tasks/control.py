"""The control channel between the scheduler and `ocrfleet worker --scaled` launchers.

A scaled launcher registers itself in Redis (`ocrfleet:launcher:<name>`: its role and how
many device slots it has, with a time to live) and runs as many of its per-device workers
as `ocrfleet:desired:<name>` says, starting from none. Lowering the number stops the
highest slots with a warm shutdown (SIGTERM: the page in flight finishes, a reserved but
unstarted message goes back to its queue). The scheduler's local actuator
(`ocrfleet.scheduler.actuators`) writes the desired numbers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time

import redis

log = logging.getLogger(__name__)

LAUNCHER_PREFIX = "ocrfleet:launcher:"
DESIRED_PREFIX = "ocrfleet:desired:"
REGISTRATION_TTL_S = 15


def launcher_key(name: str) -> str:
    return f"{LAUNCHER_PREFIX}{name}"


def desired_key(name: str) -> str:
    return f"{DESIRED_PREFIX}{name}"


def default_name(role: str) -> str:
    return f"{role}@{socket.gethostname()}"


class ControlChannel:
    """The launcher's end: register, and read how many workers to run."""

    def __init__(self, broker_url: str, name: str, role: str, slots: int) -> None:
        self.name = name
        self.role = role
        self.slots = slots
        self._conn = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
        self._desired = 0

    def poll(self, running: int) -> int:
        """Register (with what runs now) and return the desired count, clipped to the
        slots; on a broker error keep the last known one."""
        record = {
            "name": self.name,
            "role": self.role,
            "slots": self.slots,
            "running": running,
            "ts": time.time(),
        }
        try:
            pipe = self._conn.pipeline()
            pipe.set(launcher_key(self.name), json.dumps(record), ex=REGISTRATION_TTL_S)
            pipe.get(desired_key(self.name))
            _, value = pipe.execute()
        except redis.RedisError as exc:
            log.warning("control channel unreachable, keeping %d worker(s): %s", self._desired, exc)
            return self._desired
        desired = int(value) if value is not None else 0
        self._desired = max(0, min(self.slots, desired))
        return self._desired

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self._conn.delete(launcher_key(self.name))
        self._conn.close()
