"""`ocrfleet scheduler`: read the signals, decide, record, act, export; every tick.

Each pool (device workers `gpu`, CPU `ingest` pools) has its own policy state and
actuator. Without actuators the scheduler only reports: it decides for both pools as if
the pools were the workers heartbeating now, and changes nothing. Every decision is stored
in `scaling_decisions` with the inputs it was made on, applied or not (`--dry-run`, or no
actuator), so `ocrfleet scheduler explain` can say afterwards why the fleet had the size
it had. The desired and actual sizes, backlog, page ages and the measured rates are also
exported as Prometheus metrics (the Kubernetes actuator is nothing more than that).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import select

from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.scheduler import exporter
from ocrfleet.scheduler.actuators import Actuator, ReportOnly
from ocrfleet.scheduler.policy import Decision, PoolState, decide, demand_of, pool_params
from ocrfleet.scheduler.signals import Snapshot, read_snapshot

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        actuators: Sequence[Actuator],
        *,
        dry_run: bool = False,
        conn: redis.Redis | None = None,
    ) -> None:
        if not settings.broker_url:
            raise ValueError("OCRFLEET_BROKER_URL is not set: the scheduler reads the queues")
        self.settings = settings
        self.actuators = list(actuators) or [ReportOnly("gpu"), ReportOnly("ingest")]
        self.dry_run = dry_run or not actuators
        self.conn = conn or redis.Redis.from_url(
            settings.broker_url, socket_timeout=10, socket_connect_timeout=5
        )
        self.states: dict[str, PoolState] = {}
        self._said: dict[str, tuple[int, int]] = {}  # role -> (current, desired) last logged
        self._unserved: list[str] = []  # runs last reported waiting for a worker of their own
        for actuator in self.actuators:
            pool_params(settings, actuator.role)  # a bad pre-warm window fails here
            self.states[actuator.role] = PoolState(target=actuator.current() or 0)

    def tick(self, now: float | None = None) -> tuple[Snapshot, list[Decision]]:
        now = time.time() if now is None else now
        snapshot = read_snapshot(self.conn, self.settings.database_url, now)
        decisions = []
        for actuator in self.actuators:
            role = actuator.role
            cap = actuator.capacity() if role == "gpu" else None
            params = pool_params(self.settings, role, device_cap=cap)
            state = self.states[role]
            live = len(snapshot.live(role))
            if isinstance(actuator, ReportOnly):  # the pool is what heartbeats now
                state = replace(state, target=live)
            decision, new_state = decide(demand_of(snapshot, role), state, params, now)
            if self.dry_run:
                new_state = replace(new_state, target=state.target)
            else:
                actuator.apply(decision.desired)
            self.states[role] = new_state
            self._record(decision, actuator.name)
            exporter.record(decision, actual=live)
            decisions.append(decision)
            said = (decision.current, decision.desired)
            if decision.direction and self._said.get(role) != said:  # not every tick
                self._said[role] = said
                verb = "would set" if self.dry_run else "set"
                log.info(
                    "%s: %s %d (now %d): %s",
                    role,
                    verb,
                    decision.desired,
                    decision.current,
                    decision.reason,
                )
        exporter.observe(snapshot)
        self._report_unserved(snapshot)
        return snapshot, decisions

    def _report_unserved(self, snapshot: Snapshot) -> None:
        unserved = snapshot.unserved_runs()
        if unserved and unserved != self._unserved:  # once per change, not every tick
            runs = {w.run_id for w in snapshot.workers if w.run_id}
            log.warning(
                "run mismatch: work of run %s waits, but the live workers run %s; "
                "start workers of that run or resubmit under theirs (ocrfleet run-id)",
                ", ".join(r[:12] for r in unserved),
                ", ".join(sorted(r[:12] for r in runs)) or "none",
            )
        self._unserved = unserved

    def _record(self, decision: Decision, actuator: str) -> None:
        with session_scope(self.settings.database_url) as session:
            session.add(
                models.ScalingDecision(
                    decided_at=datetime.fromtimestamp(decision.at).astimezone(),
                    role=decision.role,
                    actuator=actuator,
                    current=decision.current,
                    desired=decision.desired,
                    applied=not self.dry_run,
                    reason=decision.reason,
                    inputs=decision.inputs,
                )
            )

    def run(self, stop: Any = None) -> None:
        """Tick every `scale_interval_s` until `stop` (a threading.Event) is set."""
        interval = self.settings.scale_interval_s
        while stop is None or not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # a broker or database blip: log it, try again next tick
                log.exception("scheduler tick failed")
            left = interval - (time.monotonic() - started)
            if stop is not None:
                stop.wait(max(0.0, left))
            else:
                time.sleep(max(0.0, left))


def recent_decisions(database_url: str, limit: int = 20, role: str | None = None) -> list[Any]:
    """The latest decisions, newest first."""
    table = models.ScalingDecision
    query = select(table).order_by(table.id.desc()).limit(limit)
    if role is not None:
        query = query.where(table.role == role)
    with session_scope(database_url) as session:
        return list(session.scalars(query).all())
