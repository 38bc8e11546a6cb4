"""How many workers a pool should run: pure functions over a `Snapshot`, no I/O.

Target tracking on two signals per priority: every page of the backlog, and of the
arrivals that keep coming, must have started before the oldest page of that priority
reaches `target_fraction` of its SLO (and in any case before the SLO itself); a running
worker holds one page of the backlog already. A worker added now only helps after its
start-up time (its measured model load), so additions are sized on the time left after
start-up, and the running ones are counted for the whole period.
In steady state the pool is the arrival rate over a worker's rate, with no extra
headroom: queueing is what the backlog terms size for. Both rates are measured over
windows of time (`ocrfleet.scheduler.rates`): a worker's from the units finished per busy
worker-second, the arrivals' as the smaller of the rate window's and the SLO's average.

Shape of the response: up at once, to the full size needed (one step per spike), when
there is work waiting or running (expected arrivals alone start nothing); down slowly,
one quarter of the pool at a time, only when the smaller pool keeps `hysteresis` spare
capacity over the largest need of the last cooldown, only a cooldown after the last change
(`down_cooldown_s`, never under `idle_loads` start-ups), and never on an assumed rate
while work waits, so a pool does not flap. To the minimum (zero for device pools) once
nothing has arrived and nothing waited or ran for `idle_wait_s` (`idle_loads` start-ups,
at least `min_idle_s`): restarting costs a model load, and an idle pool pays that much
again within a few load times. So after the last page of a burst finishes, the pool is at
its minimum within `idle_wait_s` plus two ticks. Pre-warm windows (cron) raise the minimum
before known peaks. Never more device workers than devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ocrfleet.scheduler.rates import History, Sample
from ocrfleet.scheduler.signals import Snapshot
from ocrfleet.tasks import routing

# Until ingest workers have split documents: documents/s of one pool process, start-up s.
INGEST_DEFAULT_RATE = 1.0
INGEST_DEFAULT_STARTUP_S = 2.0


# -- cron windows ------------------------------------------------------------------------


def _cron_field(text: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if body == "*":
            start, end = low, high
        elif "-" in body:
            start, end = (int(v) for v in body.split("-", 1))
        else:
            start = end = int(body)
        if start < low or end > high or step < 1:
            raise ValueError(f"cron field {text!r} outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return values


def cron_matches(expression: str, moment: datetime) -> bool:
    """Whether the 5-field cron `expression` (minute hour day month weekday; weekday 0 or 7
    is Sunday) fires at `moment`'s minute. Day-of-month and weekday combine as in cron:
    either may match when both are restricted."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"cron expression needs 5 fields: {expression!r}")
    minute, hour, dom, month, dow = fields
    weekday = (moment.weekday() + 1) % 7  # Monday=1 ... Sunday=0
    dows = {d % 7 for d in _cron_field(dow, 0, 7)}
    day_ok_dom = moment.day in _cron_field(dom, 1, 31)
    day_ok_dow = weekday in dows
    both_restricted = dom != "*" and dow != "*"
    day_ok = (day_ok_dom or day_ok_dow) if both_restricted else (day_ok_dom and day_ok_dow)
    return (
        moment.minute in _cron_field(minute, 0, 59)
        and moment.hour in _cron_field(hour, 0, 23)
        and moment.month in _cron_field(month, 1, 12)
        and day_ok
    )


@dataclass(frozen=True)
class Prewarm:
    """From each time `cron` fires, keep at least `workers` for `minutes`."""

    cron: str
    minutes: int
    workers: int

    def active(self, now: float) -> bool:
        start = math.floor(now / 60) * 60
        for back in range(self.minutes):
            moment = datetime.fromtimestamp(start - back * 60, UTC)
            if cron_matches(self.cron, moment):
                return True
        return False


def parse_prewarm(text: str) -> tuple[Prewarm, ...]:
    """`'0 8 * * 1-5=60:4;30 17 * * *=20:2'` -> windows (cron=MINUTES:WORKERS, ';'-separated)."""
    windows = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        cron, _, rest = item.rpartition("=")
        minutes, _, workers = rest.partition(":")
        try:
            window = Prewarm(cron.strip(), int(minutes), int(workers))
            cron_matches(window.cron, datetime.now(UTC))
        except ValueError as exc:
            want = "want 'CRON=MINUTES:WORKERS'"
            raise ValueError(f"pre-warm window {item!r}: {want} ({exc})") from exc
        windows.append(window)
    return tuple(windows)


# -- parameters, state, decisions --------------------------------------------------------


@dataclass(frozen=True)
class PoolParams:
    """One pool's knobs. `rate`/`startup_s` are fallbacks until workers report theirs."""

    role: str
    min_workers: int
    max_workers: int
    slo_s: dict[str, float]
    default_rate: float
    default_startup_s: float
    device_cap: int | None = None
    target_fraction: float = 1.0
    arrival_tau_s: float | None = None  # long arrival window; None: the normal SLO
    rate_window_s: float = 300.0  # a worker's rate, and the recent arrivals, over this long
    hysteresis: float = 0.2  # spare capacity a smaller pool must keep over the recent need
    down_step: float = 0.25  # fraction of the pool removed per scale-down
    down_cooldown_s: float = 120.0
    idle_loads: float = 5.0
    min_idle_s: float = 60.0
    interval_s: float = 10.0
    prewarm: tuple[Prewarm, ...] = ()

    @property
    def ceiling(self) -> int:
        if self.device_cap is None:
            return max(0, self.max_workers)
        return max(0, min(self.max_workers, self.device_cap))

    def idle_wait_s(self, startup_s: float) -> float:
        """How long a pool stays idle before it goes to its minimum."""
        return max(self.min_idle_s, self.idle_loads * startup_s)

    @property
    def keep_s(self) -> float:
        """History the rates need."""
        tau = self.arrival_tau_s or self.slo_s["normal"]
        return max(tau, 12 * self.rate_window_s)


@dataclass(frozen=True)
class PoolState:
    """What a pool's policy remembers between ticks."""

    target: int = 0
    changed_at: float = float("-inf")
    direction: int = 0  # +1 up, -1 down, of the last change
    flips: int = 0  # direction reversals so far
    idle_since: float | None = None
    history: History = History()
    rate: float | None = None  # the last measured rate of one worker
    needs: tuple[tuple[float, float], ...] = ()  # (time, need) over the stabilisation window


@dataclass(frozen=True)
class Demand:
    """A pool's share of a snapshot."""

    backlog: dict[str, int]  # priority -> units waiting or in flight
    oldest_age_s: dict[str, float | None]
    live: int
    startup_s: float | None  # measured start-up of one worker
    arrivals_total: int  # monotone count of units ever created
    done_total: int  # monotone count of units workers finished
    running: int  # units a worker is running now


@dataclass(frozen=True)
class Decision:
    role: str
    at: float
    current: int
    desired: int
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def direction(self) -> int:
        return (self.desired > self.current) - (self.desired < self.current)


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None and v > 0)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def demand_of(snapshot: Snapshot, role: str) -> Demand:
    """The signals that matter to `role`'s pool."""
    workers = snapshot.live(role)
    high, normal = routing.ROLES[role]
    if role == "gpu":
        queued = snapshot.backlog("gpu")
        backlog = dict(snapshot.pending_pages)
        # Pages in the queues but not in the database view (or the other way) never hide
        # work: take the larger of the two totals, put the difference on normal.
        backlog["normal"] = backlog.get("normal", 0) + max(0, queued - sum(backlog.values()))
        # A document not split yet has at least one page coming.
        backlog["normal"] += snapshot.pending_documents
        arrivals, done, task = snapshot.pages_total, snapshot.pages_finished, routing.PAGE_TASK
    else:
        q = snapshot.queues
        backlog = {
            "high": q[high].waiting + q[high].unacked if high in q else 0,
            "normal": q[normal].waiting + q[normal].unacked if normal in q else 0,
        }
        arrivals, done = snapshot.documents_total, snapshot.documents_split
        task = routing.INGEST_TASK
    return Demand(
        backlog=backlog,
        oldest_age_s=dict(snapshot.oldest_age_s),
        live=len(workers),
        startup_s=_median([w.load_s for w in workers if w.load_s]),
        arrivals_total=arrivals,
        done_total=done,
        running=snapshot.running(task),
    )


def needed_capacity(
    backlog: float, arrivals: float, rate: float, deadline_s: float, running: int, startup_s: float
) -> float:
    """Workers (fractional) so that every page of `backlog`, and of `deadline_s` of arrivals,
    has started by the deadline. A running worker holds one of the backlog's pages now and
    starts `rate * deadline_s` more; a new one starts pages only after `startup_s`."""
    work = backlog + arrivals * deadline_s
    if work <= 0:
        return 0.0
    per_running = rate * deadline_s + 1
    if running * per_running >= work:
        return work / per_running
    per_new = rate * max(deadline_s - startup_s, deadline_s * 0.1) + 1
    return running + (work - running * per_running) / per_new


def needed_workers(
    backlog: float, arrivals: float, rate: float, deadline_s: float, running: int, startup_s: float
) -> int:
    """`needed_capacity` in whole workers."""
    need = needed_capacity(backlog, arrivals, rate, deadline_s, running, startup_s)
    return max(1, math.ceil(need - 1e-9)) if need > 0 else 0


@dataclass(frozen=True)
class Need:
    """Workers (fractional) a pool needs, which term set it, and each priority's deadline."""

    workers: float
    binding: str
    deadlines: dict[str, float]

    @property
    def whole(self) -> int:
        return max(1, math.ceil(self.workers - 1e-9)) if self.workers > 0 else 0


def need_of(
    demand: Demand, params: PoolParams, arrivals: float, rate: float, startup: float, running: int
) -> Need:
    """What `demand` needs at `arrivals` units/s and `rate` units/s per worker, with
    `running` workers on it now."""
    # Per priority: high preempts normal, so normal's deadline covers both backlogs.
    # Arrivals of a priority are not measured apart: high gets the share it has of the
    # backlog, normal (which waits behind high anyway) all of them.
    need, binding, cumulative = 0.0, "", 0.0
    deadlines = {}
    backlog_total = sum(demand.backlog.values())
    for priority in ("high", "normal"):
        cumulative += demand.backlog.get(priority, 0)
        slo = params.slo_s[priority]
        age = demand.oldest_age_s.get(priority) or 0.0
        deadline = max(params.interval_s, min(params.target_fraction * slo, slo - age))
        deadlines[priority] = deadline
        if cumulative <= 0:
            continue
        share = 1.0 if priority == "normal" else cumulative / backlog_total
        n = needed_capacity(cumulative, arrivals * share, rate, deadline, running, startup)
        if n > need:
            need, binding = n, priority
    # The arrival rate itself, with no headroom: queueing is what the backlog terms above
    # (sized on each priority's SLO) are for.
    steady = arrivals / rate
    if steady > need:
        need, binding = steady, "arrivals"
    return Need(need, binding, deadlines)


def decide(
    snapshot_demand: Demand, state: PoolState, params: PoolParams, now: float
) -> tuple[Decision, PoolState]:
    """The pool size to set now, why, and the state to keep for the next tick."""
    demand = snapshot_demand
    startup = demand.startup_s if demand.startup_s is not None else params.default_startup_s
    sample = Sample(now, demand.arrivals_total, demand.done_total, demand.running)
    history = state.history.add(sample, params.keep_s)
    measured = history.worker_rate(params.rate_window_s) or state.rate
    rate = measured or params.default_rate
    # Bursts shorter than the normal SLO are the queue's to absorb (the backlog terms see
    # them at once), so the long window is about that long.
    tau = params.arrival_tau_s or params.slo_s["normal"]
    arrivals = history.arrival_rate(params.rate_window_s, tau)
    current = state.target
    floor = params.min_workers
    for window in params.prewarm:
        if window.active(now):
            floor = max(floor, window.workers)
    ceiling = params.ceiling
    floor = min(floor, ceiling)

    need_of_now = need_of(demand, params, arrivals, rate, startup, current)
    need_f, need = need_of_now.workers, need_of_now.whole

    # Scale-down follows the largest need of the last cooldown (a stabilisation window, as
    # Kubernetes' HPA does), so one quiet tick between bursts removes nothing, and keeps
    # `hysteresis` spare capacity over it: a pool that grows when the need passes its size
    # shrinks only when the need is clearly below it, so noise between the two moves nothing.
    # Removing a worker that is needed again costs a start-up, so the cooldown is never
    # shorter than `idle_loads` start-ups.
    cooldown = max(params.down_cooldown_s, params.idle_loads * startup)
    needs = tuple((at, n) for at, n in state.needs if now - at < cooldown)
    needs += ((now, need_f),)
    recent_need = max(n for _, n in needs)
    keep_need = math.ceil(recent_need * (1 + params.hysteresis) - 1e-9)

    # Idle: nothing waits or runs, and nothing arrived since the last tick.
    backlog_total = sum(demand.backlog.values())
    previous = history.samples[-2] if len(history.samples) > 1 else sample
    idle = backlog_total == 0 and demand.arrivals_total == previous.arrivals
    idle_since = (state.idle_since if state.idle_since is not None else now) if idle else None
    idle_for = 0.0 if idle_since is None else now - idle_since
    idle_wait = params.idle_wait_s(startup)

    inputs = {
        "backlog": dict(demand.backlog),
        "oldest_age_s": dict(demand.oldest_age_s),
        "live": demand.live,
        "running": demand.running,
        "rate": rate,
        "rate_measured": measured is not None,
        "startup_s": startup,
        "startup_measured": demand.startup_s is not None,
        "arrival_rate": arrivals,
        "deadline_s": need_of_now.deadlines,
        "need": need,
        "need_exact": round(need_f, 3),
        "recent_need": round(recent_need, 3),
        "cooldown_s": cooldown,
        "floor": floor,
        "ceiling": ceiling,
        "idle_for_s": idle_for,
        "idle_wait_s": idle_wait,
    }

    cooled = now - state.changed_at >= cooldown
    desired, reason = current, "hold"
    # Up only for work there is: arrivals expected with nothing waiting or running grow
    # no pool (they are backlog one tick after they come), so an idle pool stays down.
    if need > current and backlog_total > 0:
        desired = min(need, ceiling)
        reason = f"up: {need_of_now.binding} needs {need} worker(s)" + (
            f", capped at {ceiling}" if need > ceiling else ""
        )
    elif current > floor and idle and idle_for >= idle_wait:
        desired, reason = floor, f"idle {idle_for:.0f}s >= {idle_wait:.0f}s: to the minimum"
    elif current > max(floor, 1):
        # Down only when the pool is clearly too big (`hysteresis`), a step at a time, and
        # one worker stays warm until the pool has been idle long enough.
        keep = max(floor, 1, keep_need)
        if keep < current:
            if measured is None and backlog_total > 0:
                # An assumed rate shrank a busy ingest pool at start: wait for a measured one.
                reason = "hold: no rate measured yet"
            elif cooled:
                step = max(1, math.floor(current * params.down_step))
                desired = max(keep, current - step)
                reason = f"down: at most {recent_need:.1f} needed of {current} lately"
            else:
                reason = f"hold: cooling down ({now - state.changed_at:.0f}s since the last change)"
    if desired < floor:
        desired, reason = floor, f"up: minimum {floor}"
    desired = min(desired, ceiling)

    direction = (desired > current) - (desired < current)
    reversed_ = bool(direction and state.direction and direction != state.direction)
    flips = state.flips + int(reversed_)
    new_state = replace(
        state,
        target=desired,
        changed_at=now if direction else state.changed_at,
        direction=direction or state.direction,
        flips=flips,
        idle_since=idle_since,
        history=history,
        rate=measured,
        needs=needs,
    )
    return Decision(params.role, now, current, desired, reason, inputs), new_state


def pool_params(settings: Any, role: str, device_cap: int | None = None) -> PoolParams:
    """A pool's parameters from the settings."""
    gpu = role == "gpu"
    return PoolParams(
        role=role,
        min_workers=getattr(settings, f"scale_min_{role}"),
        max_workers=getattr(settings, f"scale_max_{role}"),
        slo_s={"high": settings.slo_high_s, "normal": settings.slo_normal_s},
        default_rate=settings.scale_default_rate if gpu else INGEST_DEFAULT_RATE,
        default_startup_s=settings.scale_default_startup_s if gpu else INGEST_DEFAULT_STARTUP_S,
        device_cap=device_cap,
        rate_window_s=settings.scale_rate_window_s,
        down_cooldown_s=settings.scale_down_cooldown_s,
        idle_loads=settings.scale_idle_loads,
        min_idle_s=settings.scale_min_idle_s,
        interval_s=settings.scale_interval_s,
        prewarm=parse_prewarm(settings.scale_prewarm) if gpu else (),
    )
