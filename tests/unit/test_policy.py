"""The scaling policy as pure functions: no Redis, no database."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from ocrfleet.scheduler.policy import (
    Demand,
    PoolParams,
    PoolState,
    Prewarm,
    cron_matches,
    decide,
    need_of,
    needed_capacity,
    needed_workers,
    parse_prewarm,
)
from ocrfleet.scheduler.rates import History, Sample

PARAMS = PoolParams(
    role="gpu",
    min_workers=0,
    max_workers=20,
    slo_s={"high": 120.0, "normal": 900.0},
    default_rate=0.5,
    default_startup_s=10.0,
    down_cooldown_s=300.0,
    idle_loads=5.0,
    min_idle_s=60.0,
    interval_s=10.0,
)


def demand(
    normal: int = 0,
    high: int = 0,
    *,
    age_normal: float | None = None,
    age_high: float | None = None,
    total: int = 0,
    done: int = 0,
    running: int = 0,
    startup: float | None = 10.0,
    live: int = 0,
) -> Demand:
    """Nothing finished unless `done` says so: the rate is PARAMS' 0.5 pages/s."""
    return Demand(
        backlog={"high": high, "normal": normal},
        oldest_age_s={"high": age_high, "normal": age_normal},
        live=live,
        startup_s=startup,
        arrivals_total=total,
        done_total=done,
        running=running,
    )


def run(
    steps: list[Demand], params: PoolParams = PARAMS, state: PoolState | None = None, dt=10.0
) -> list[int]:
    state = state or PoolState()
    targets = []
    for i, step in enumerate(steps):
        decision, state = decide(step, state, params, 1_000_000.0 + i * dt)
        targets.append(decision.desired)
    return targets


def test_a_backlog_is_sized_to_drain_before_the_slo_counting_start_up() -> None:
    # 900 pages, 0.5 pages/s per worker, all started within the 900 s SLO, 10 s start-up:
    # 900 / (0.5 * (900 - 10) + 1) = 2.02 -> 3 new workers.
    (decision, _) = decide(demand(normal=900, age_normal=0.0), PoolState(), PARAMS, 0.0)
    assert decision.desired == 3
    assert decision.reason.startswith("up: normal")
    # A slower start-up costs more workers for the same backlog.
    slow = decide(demand(normal=900, age_normal=0.0, startup=500.0), PoolState(), PARAMS, 0.0)
    assert slow[0].desired > decision.desired
    # ... and a longer scale-down cooldown: removing a worker costs a start-up to undo.
    assert decision.inputs["cooldown_s"] == 300.0
    assert slow[0].inputs["cooldown_s"] == 5 * 500.0


def test_an_old_page_tightens_the_deadline() -> None:
    fresh = decide(demand(normal=300, age_normal=0.0), PoolState(), PARAMS, 0.0)[0].desired
    late = decide(demand(normal=300, age_normal=800.0), PoolState(), PARAMS, 0.0)[0].desired
    assert late > fresh


def test_high_priority_has_its_own_tighter_slo() -> None:
    high = decide(demand(high=100, age_high=0.0), PoolState(), PARAMS, 0.0)[0]
    normal = decide(demand(normal=100, age_normal=0.0), PoolState(), PARAMS, 0.0)[0]
    assert high.desired > normal.desired
    assert high.reason.startswith("up: high")


def test_min_max_and_the_device_cap() -> None:
    capped = replace(PARAMS, device_cap=2)
    decision = decide(demand(normal=10_000, age_normal=0.0), PoolState(), capped, 0.0)[0]
    assert decision.desired == 2 and "capped at 2" in decision.reason
    floor = replace(PARAMS, min_workers=3)
    assert decide(demand(), PoolState(), floor, 0.0)[0].desired == 3


def test_up_at_once_then_to_the_minimum_after_the_idle_wait() -> None:
    busy = [demand(normal=900, age_normal=0.0, total=900)]
    quiet = [demand(normal=0, total=900) for _ in range(200)]  # 2000 s of nothing new
    targets = run(busy + quiet)
    assert targets[0] == 3  # all at once
    # Idle from the first quiet tick (t=10) for max(60 s, 5 load times of 10 s) = 60 s:
    # the cooldown after the scale-up does not hold an idle pool.
    assert targets[1:7] == [3] * 6
    assert targets[7:] == [0] * (len(targets) - 7)


def test_an_arrival_restarts_the_idle_wait() -> None:
    steps = [demand(normal=10, age_normal=0.0, total=10)] + [demand(total=10)] * 4
    steps += [demand(total=11)] + [demand(total=11)] * 10  # one page came (and went) at t=50
    targets = run(steps)
    assert targets[:12] == [1] * 12  # idle from t=60 only: 60 s later is t=120
    assert targets[12] == 0


def test_a_busy_pool_shrinks_a_step_at_a_time() -> None:
    state = PoolState(target=8)
    # Enough work for 2 workers keeps arriving: 8 -> 6 -> 5 -> 4 -> 3 -> 2, a cooldown apart.
    total, targets = 0, [8]
    for i in range(300):
        total += 6  # 0.6 pages/s, done at 0.6 pages/s by a busy worker: one, and one spare
        step = demand(normal=2, total=total, done=total - 2, running=1)
        decision, state = decide(step, state, PARAMS, i * 10.0)
        targets.append(decision.desired)
    pairs = enumerate(zip(targets, targets[1:], strict=False))
    moves = [(i, b - a) for i, (a, b) in pairs if b != a]
    assert [m for _, m in moves] == [-2, -1, -1, -1, -1]
    assert all(b - a >= 30 for (a, _), (b, _) in zip(moves, moves[1:], strict=False))  # 300 s apart
    assert targets[-1] == 2


def test_scale_to_zero_waits_for_several_load_times() -> None:
    params = replace(PARAMS, down_cooldown_s=0.0, min_idle_s=0.0)
    state = PoolState(target=1)
    slow_start = demand(startup=100.0)  # 5 x 100 s of idleness needed
    targets = run([slow_start] * 60, params, state)  # 600 s
    assert targets[45] == 1  # 450 s idle: still warm
    assert targets[-1] == 0


def test_noise_around_a_boundary_does_not_flap() -> None:
    """Arrivals jittering around 3.3 workers' worth: the pool grows and stays."""
    params = replace(PARAMS, down_cooldown_s=60.0)
    state, total, targets = PoolState(), 0, []
    for i in range(400):
        total += 16 if i % 2 else 17  # ~1.65 pages/s, 3.3 workers of 0.5 pages/s
        decision, state = decide(demand(normal=5, total=total), state, params, i * 10.0)
        targets.append(decision.desired)
    # It grows while the arrival-rate average settles, and never shrinks back.
    assert all(b >= a for a, b in zip(targets, targets[1:], strict=False))
    assert state.flips == 0
    assert targets[-1] == 4


def _poisson_pages(rng: random.Random, pages_per_s: float, seconds: int) -> int:
    """Pages arriving in `seconds`: Poisson documents of 1 to 8 pages."""
    pages = 0
    for _ in range(seconds):
        limit, p = math.exp(-pages_per_s / 4.5), rng.random()
        while p > limit:
            pages += rng.randint(1, 8)
            p *= rng.random()
    return pages


def _replay(rate_of, seconds: int, seed: int) -> tuple[list[int], PoolState]:
    """Tick every 10 s over Poisson arrivals; each worker does 0.5 pages/s of the backlog."""
    rng, state, total, backlog, targets = random.Random(seed), PoolState(), 0, 0.0, []
    for i in range(seconds // 10):
        now = i * 10.0
        new = _poisson_pages(rng, rate_of(now), 10)
        total += new
        backlog = max(0.0, backlog + new - state.target * 0.5 * 10)
        step = demand(normal=round(backlog), age_normal=0.0 if backlog else None, total=total)
        decision, state = decide(step, state, PARAMS, now)
        targets.append(decision.desired)
    return targets, state


def _direction_changes(targets: list[int]) -> int:
    moves = [b - a for a, b in zip(targets, targets[1:], strict=False) if b != a]
    return sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0)) + bool(
        moves
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_poisson_noise_on_a_steady_load_does_not_flap(seed: int) -> None:
    """Four workers' worth of 1-8 page documents for two hours."""
    targets, _ = _replay(lambda _t: 2.0, 7200, seed)
    settled = targets[180:]  # after the first half hour (the cold start)
    assert max(settled) - min(settled) <= 2
    # A reversal at most every half hour, never two within one cooldown.
    assert _direction_changes(settled) <= 4
    changes = [i for i, (a, b) in enumerate(zip(settled, settled[1:], strict=False)) if a != b]
    assert all(b - a >= 30 for a, b in zip(changes, changes[1:], strict=False))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_ten_times_spike_is_one_way_up_then_one_way_down(seed: int) -> None:
    """10x the base load for 5 minutes after an hour: up, then down, no re-growth."""

    def rate(t: float) -> float:
        return 1.0 * (10 if 3600 <= t < 3900 else 1)

    targets, _ = _replay(rate, 7200, seed)
    spike = targets[359 : 360 + 180]  # from just before the spike to 30 minutes after it
    assert max(spike) >= 10
    assert _direction_changes(spike) <= 2


def test_never_more_device_workers_than_devices_even_for_a_spike() -> None:
    capped = replace(PARAMS, device_cap=2, max_workers=50)
    state, total = PoolState(), 0
    for i in range(60):
        total += 200
        step = demand(normal=5000, age_normal=i * 10.0, total=total)
        decision, state = decide(step, state, capped, i * 10.0)
        assert decision.desired <= 2


def test_the_decision_carries_its_inputs() -> None:
    decision, _ = decide(demand(normal=50, age_normal=30.0), PoolState(), PARAMS, 0.0)
    assert decision.inputs["rate"] == 0.5 and decision.inputs["rate_measured"] is False
    assert decision.inputs["backlog"] == {"high": 0, "normal": 50}
    assert decision.inputs["oldest_age_s"]["normal"] == 30.0


def test_needed_workers_counts_running_ones_fully() -> None:
    assert needed_workers(0, 0, 1.0, 100, 3, 10) == 0
    assert needed_workers(100, 0, 1.0, 100, 0, 0) == 1
    assert needed_workers(100, 0, 1.0, 100, 2, 50) == 1  # the running ones suffice
    # Each running worker starts 1.0 * 100 pages and holds one: 98 left / (1.0 * 50 + 1).
    assert needed_workers(300, 0, 1.0, 100, 2, 50) == 2 + 2


def test_pages_already_running_need_no_new_workers() -> None:
    """The SLO is met once a page has started: 4 workers on 4 pages, 10 s before the
    deadline of 30 s pages, are enough (draining them would have asked for 12)."""
    assert needed_capacity(4, 0, 1 / 30, 10, 4, 7) <= 4
    assert needed_workers(4, 0, 1 / 30, 10, 4, 7) <= 4
    # Four more waiting pages than workers do need more.
    assert needed_workers(8, 0, 1 / 30, 10, 4, 7) > 4


def test_cron_windows() -> None:
    monday_8 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)  # a Monday
    assert cron_matches("0 8 * * 1-5", monday_8)
    assert not cron_matches("0 8 * * 0,6", monday_8)
    assert cron_matches("*/15 8 * * *", monday_8.replace(minute=45))
    assert not cron_matches("*/15 8 * * *", monday_8.replace(minute=44))
    (window,) = parse_prewarm("0 8 * * 1-5=60:4")
    assert window == Prewarm("0 8 * * 1-5", 60, 4)
    assert window.active(monday_8.timestamp() + 59 * 60)
    assert not window.active(monday_8.timestamp() + 61 * 60)
    assert not window.active(monday_8.timestamp() - 60)
    params = replace(PARAMS, prewarm=(window,))
    assert decide(demand(), PoolState(), params, monday_8.timestamp() + 600)[0].desired == 4
    with pytest.raises(ValueError, match="CRON=MINUTES:WORKERS"):
        parse_prewarm("0 8 * *=60:4")


# -- measured rates ---------------------------------------------------------------------


def _history(pages: list[float], *, tick: float = 5.0, workers: int = 1) -> History:
    """Heartbeat-like samples every `tick` s of `workers` doing pages of these durations."""
    history, at, done, end = History(), 0.0, 0, 0.0
    ends = []
    for duration in pages:
        end += duration
        ends.append(end)
    while at <= end:
        done = sum(1 for e in ends if e <= at)
        running = workers if done < len(pages) else 0
        sample = Sample(at, arrivals=len(pages) * workers, done=done * workers, running=running)
        history = history.add(sample, keep_s=3600)
        at += tick
    return history


def test_the_worker_rate_is_pages_per_busy_second_over_a_window() -> None:
    # 30 s pages sampled every 5 s: most samples see no page finish, none counts as zero.
    assert _history([30.0] * 20).worker_rate(300) == pytest.approx(1 / 30, rel=0.05)
    assert _history([30.0] * 20, workers=4).worker_rate(300) == pytest.approx(1 / 30, rel=0.05)
    # Idle time lowers nothing: the rate is per busy second.
    idle = History()
    for i, (done, running) in enumerate([(0, 1), (1, 0), (1, 0), (1, 0), (1, 1), (2, 0)]):
        idle = idle.add(Sample(i * 30.0, 2, done, running), keep_s=3600)
    assert idle.worker_rate(300, min_done=1) == pytest.approx(1 / 30)
    assert History().worker_rate(300) is None


def test_a_long_page_lowers_the_rate_by_its_length_not_to_zero() -> None:
    """The finding: a worker 5 minutes into one page was 'needing 72 workers' from a rate
    of 0.001, every heartbeat inside the page having counted as zero."""
    history = _history([30.0] * 60 + [900.0])
    during = History(tuple(s for s in history.samples if s.at <= 1800 + 300))  # 300 s in
    # The window reaches back to 50 completions: 50 pages of 30 s and 300 s of the long one.
    assert during.worker_rate(300) == pytest.approx(50 / 1800)
    # 60 pages to start within 900 s: 2 workers at 30 s a page, 3 at the rate one tick
    # later, where the per-heartbeat rate asked for 72.
    fresh = replace(PARAMS, default_rate=1 / 30, rate_window_s=300)
    backlog = demand(normal=60, age_normal=0.0, total=61, done=60, running=1)
    usual = decide(backlog, PoolState(), fresh, 0.0)[0]
    slow = decide(backlog, PoolState(history=during), fresh, 2105.0)[0]
    assert slow.inputs["rate"] == pytest.approx(50 / 1805) and slow.inputs["rate_measured"]
    assert (usual.inputs["need"], slow.inputs["need"]) == (2, 3)


def test_a_burst_is_not_counted_again_as_arrivals_to_come() -> None:
    history = History()
    for t in range(0, 3600, 10):
        total = t // 10 + (3000 if t >= 1800 else 0)  # 0.1 pages/s, and 3000 at once
        history = history.add(Sample(float(t), total, 0, 0), keep_s=900)
        if t == 1800:
            assert history.arrival_rate(60, 900) <= 3000 / 900 + 0.1
        if t == 1800 + 70:  # one short window later: the base rate again
            assert history.arrival_rate(60, 900) == pytest.approx(0.1, abs=0.02)
    assert history.last_arrival() == 3590.0


def test_an_ingest_pool_is_sized_on_its_measured_rate() -> None:
    """The finding: the ingest pool, sized from an assumed 1 document/s, went from 2
    processes to 1 at start and stayed there through a 60-document backlog."""
    params = replace(PARAMS, role="ingest", min_workers=1, default_rate=1.0, down_cooldown_s=0)
    backlog = demand(normal=90, age_normal=0.0, total=110, done=20, running=2)
    first, state = decide(backlog, PoolState(target=2), params, 0.0)
    assert (first.desired, first.reason) == (2, "hold: no rate measured yet")
    # Two processes busy for 300 s split 20 documents: 30 s a document, 90 of them to
    # start within the 900 s SLO need three.
    history = History()
    for t in range(0, 300, 10):
        history = history.add(Sample(float(t), 110, 20 * t // 300, 2), keep_s=3600)
    measured, _ = decide(backlog, replace(state, history=history), params, 300.0)
    assert measured.inputs["rate"] == pytest.approx(1 / 30)
    assert measured.desired == 3 and measured.reason.startswith("up:")


# -- generated traces: a discrete fleet under the policy ----------------------------------

STARTUP_S = 10.0


def _fleet(
    pages_per_s, seconds: int, seed: int, durations: list[int]
) -> tuple[list[tuple[float, int, int, int]], float | None, float | None]:
    """Poisson documents of 1-8 pages; a worker serves one page at a time for a duration
    drawn from `durations` (s) and is useful STARTUP_S after it was asked for; a stopped
    worker finishes its page. Returns (time, current, desired, the need at the true
    rates) per tick, when the last page finished, and when the pool last reached 0."""
    rng = random.Random(seed)
    rate = 1 / (sum(durations) / len(durations))
    params = replace(PARAMS, max_workers=200, default_rate=rate)
    state, queue, workers = PoolState(), deque(), []
    running: list[tuple[int, float]] = []  # (ends at, arrived at)
    arrived = done = 0
    ticks, drained, at_min = [], None, None
    for t in range(seconds):
        for _ in range(_poisson(rng, pages_per_s(t) / 4.5)):
            pages = rng.randint(1, 8)
            queue.extend([float(t)] * pages)
            arrived += pages
        finished = [r for r in running if r[0] <= t]
        done += len(finished)
        running = [r for r in running if r[0] > t]
        for worker in workers:
            if worker["until"] <= t:
                worker["busy"] = False
        workers = [w for w in workers if not (w["stop"] and not w["busy"])]
        if finished and not queue and not running:
            drained = float(t)
        if t % 10 == 0:
            oldest = min([*list(queue)[:1], *(a for _, a in running)], default=None)
            step = demand(
                normal=len(queue) + len(running),
                age_normal=None if oldest is None else t - oldest,
                total=arrived,
                done=done,
                running=len(running),
                startup=STARTUP_S,
            )
            current = state.target
            need = need_of(step, params, pages_per_s(t), rate, STARTUP_S, current).whole
            decision, state = decide(step, state, params, float(t))
            ticks.append((float(t), current, decision.desired, need))
            if decision.desired == 0 and current > 0:
                at_min = float(t)
            active = [w for w in workers if not w["stop"]]
            for _ in range(decision.desired - len(active)):
                workers.append({"ready": t + STARTUP_S, "until": 0, "busy": False, "stop": False})
            for worker in sorted(active, key=lambda w: w["busy"])[decision.desired :]:
                worker["stop"] = True
            workers = [w for w in workers if not (w["stop"] and not w["busy"])]
        for worker in workers:
            if queue and not worker["busy"] and not worker["stop"] and worker["ready"] <= t:
                worker["until"] = t + rng.choice(durations)
                worker["busy"] = True
                running.append((worker["until"], queue.popleft()))
    return ticks, drained, at_min


def _poisson(rng: random.Random, lam: float) -> int:
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


# Pages of 2 s, one in twenty of 40 s: the long pages that made the rate collapse.
LONG_TAIL = [2] * 19 + [40]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_decision_asks_for_more_than_twice_what_the_load_needs(seed: int) -> None:
    """A steady load with a 10x spike, then a burst out of nothing and silence: every
    scale-up asks for at most twice the workers the backlog and the arrivals (at their
    true rates) need, and after the last page the pool is at zero within the idle wait."""

    def load(t: float) -> float:
        if t < 3600:
            return 1.0 * (10 if 1800 <= t < 2100 else 1)
        return 12.0 if 4200 <= t < 4320 else 0.0

    ticks, drained, at_min = _fleet(load, 7200, seed, LONG_TAIL)
    ups = [(t, desired, need) for t, current, desired, need in ticks if desired > current]
    assert max(desired for _, desired, _ in ups) >= 10  # it did follow the spike
    assert all(desired <= max(1, 2 * need) for _, desired, need in ups), ups
    assert drained is not None and at_min is not None and at_min > drained > 4320
    bound = PARAMS.idle_wait_s(STARTUP_S) + 2 * PARAMS.interval_s
    assert at_min - drained <= bound
