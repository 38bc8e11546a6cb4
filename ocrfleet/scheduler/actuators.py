"""Where a scaling decision goes. One interface, three ways to change a pool's size, and
one that changes nothing (the default: `ocrfleet scheduler` without `--actuator` reports).

- `local`: the scheduler writes each `ocrfleet worker --scaled` launcher's share of the
  desired device workers to its control channel (`ocrfleet.tasks.control`).
- `celery`: the CPU ingest pools grow and shrink through Celery's remote control
  (`pool_grow` / `pool_shrink`), never below one process per worker.
- `kubernetes`: nothing is changed here; the desired count is exported as a Prometheus
  metric (`ocrfleet_scheduler_desired_workers`) that KEDA scales the Deployment on
  (infra/kubernetes/keda.yaml).
- `ReportOnly`: the decisions are recorded and exported, and nothing is changed.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

import redis

from ocrfleet.tasks.control import LAUNCHER_PREFIX, desired_key

log = logging.getLogger(__name__)


class Actuator(Protocol):
    name: str
    role: str

    def capacity(self) -> int | None:
        """The most workers this actuator can run (devices), None if unbounded."""

    def current(self) -> int | None:
        """What it runs or was last told to run; None when it cannot tell."""

    def apply(self, desired: int) -> None: ...


class LocalActuator:
    """Device workers started and stopped by the launchers on this fleet's hosts."""

    name = "local"
    role = "gpu"

    def __init__(self, conn: redis.Redis) -> None:
        self.conn = conn

    def launchers(self) -> list[dict[str, Any]]:
        keys = sorted(self.conn.scan_iter(match=f"{LAUNCHER_PREFIX}*", count=500))
        found = []
        for raw in self.conn.mget(keys) if keys else []:
            if raw is not None:
                record = json.loads(raw)
                if record.get("role") == self.role:
                    found.append(record)
        return sorted(found, key=lambda r: r["name"])

    def capacity(self) -> int | None:
        return sum(int(r["slots"]) for r in self.launchers())

    def current(self) -> int | None:
        launchers = self.launchers()
        if not launchers:
            return 0
        values = self.conn.mget([desired_key(r["name"]) for r in launchers])
        return sum(int(v) for v in values if v is not None)

    def apply(self, desired: int) -> None:
        """Fill launchers in name order, so a scale-down empties the last ones first."""
        left = desired
        pipe = self.conn.pipeline()
        for launcher in self.launchers():
            share = max(0, min(int(launcher["slots"]), left))
            pipe.set(desired_key(launcher["name"]), share)
            left -= share
        pipe.execute()
        if left > 0:
            log.warning("asked for %d more device workers than the launchers have", left)


class CeleryPoolActuator:
    """Grow and shrink the prefork pools of the ingest workers by remote control."""

    name = "celery"
    role = "ingest"

    def __init__(self, app: Any, timeout: float = 2.0) -> None:
        self.app = app
        self.timeout = timeout

    def pools(self) -> dict[str, int]:
        """hostname -> pool processes of each ingest worker that answered."""
        stats = self.app.control.inspect(timeout=self.timeout).stats() or {}
        return {
            host: len(info.get("pool", {}).get("processes", []))
            for host, info in stats.items()
            if host.startswith("ingest@")
        }

    def capacity(self) -> int | None:
        return None

    def current(self) -> int | None:
        pools = self.pools()
        return sum(pools.values()) if pools else None

    def apply(self, desired: int) -> None:
        pools = self.pools()
        if not pools:
            return
        hosts = sorted(pools)
        # Spread evenly, at least one process per worker.
        base, extra = divmod(max(desired, len(hosts)), len(hosts))
        for index, host in enumerate(hosts):
            target = base + (1 if index < extra else 0)
            delta = target - pools[host]
            if delta > 0:
                self.app.control.pool_grow(delta, destination=[host])
            elif delta < 0:
                self.app.control.pool_shrink(-delta, destination=[host])


class MetricsOnlyActuator:
    """Kubernetes: KEDA reads the desired count from the scheduler's /metrics."""

    name = "kubernetes"

    def __init__(self, role: str) -> None:
        self.role = role
        self._desired: int | None = None

    def capacity(self) -> int | None:
        return None

    def current(self) -> int | None:
        return self._desired

    def apply(self, desired: int) -> None:
        self._desired = desired


class ReportOnly:
    """No actuator: what the policy would set, reported and never applied."""

    name = "none"

    def __init__(self, role: str) -> None:
        self.role = role

    def capacity(self) -> int | None:
        return None

    def current(self) -> int | None:
        return None

    def apply(self, desired: int) -> None:
        del desired
