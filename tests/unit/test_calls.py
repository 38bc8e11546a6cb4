"""A recogniser's thread budget split into model calls at once, and those calls run side by
side with their results in order."""

from __future__ import annotations

import threading

import pytest

from ocrfleet.engines import calls


def test_a_budget_is_split_into_calls_then_threads_per_call() -> None:
    assert calls.plan(1) == (1, 1)
    assert calls.plan(2) == (2, 1)
    assert calls.plan(3) == (3, 1)
    assert calls.plan(8) == (calls.MAX_CALLS, 8 // calls.MAX_CALLS)
    at_once, per_call = calls.plan(None)
    assert at_once == min(calls.available_cpus(), calls.MAX_CALLS) and per_call >= 1


def test_calls_run_side_by_side_and_come_back_in_order() -> None:
    # Each call waits for another to be running: this passes only if two run at once.
    meeting = threading.Barrier(2, timeout=10)

    def call(n: int) -> int:
        meeting.wait()
        return n * n

    jobs = [lambda n=n: call(n) for n in range(6)]
    assert calls.run(jobs, [1, 5, 2, 9, 3, 4], workers=2) == [n * n for n in range(6)]


def test_one_worker_runs_the_calls_in_order_on_this_thread() -> None:
    seen: list[tuple[int, str]] = []
    jobs = [lambda n=n: seen.append((n, threading.current_thread().name)) for n in range(4)]
    calls.run(jobs, [1, 9, 2, 8], workers=1)
    assert seen == [(n, threading.current_thread().name) for n in range(4)]


def test_the_costliest_call_starts_first() -> None:
    started: list[int] = []
    lock = threading.Lock()

    def call(n: int) -> None:
        with lock:
            started.append(n)

    calls.run([lambda n=n: call(n) for n in range(5)], [1, 7, 3, 9, 2], workers=2)
    assert sorted(started[:2]) == [1, 3]


def test_a_failing_call_fails_the_run() -> None:
    def bad() -> int:
        raise ValueError("unreadable crop")

    with pytest.raises(ValueError, match="unreadable crop"):
        calls.run([lambda: 1, bad, lambda: 3], [1, 1, 1], workers=2)


def test_crops_share_a_call_by_width_within_the_budget() -> None:
    widths = [320, 96, 320, 2000, 96, 320, 320]
    chunks = calls.batches(widths, batch_size=3, budget=1280)
    assert chunks == [(96, [1, 4]), (320, [0, 2, 5]), (320, [6]), (2000, [3])]
    assert sorted(i for _, chunk in chunks for i in chunk) == list(range(len(widths)))
    assert calls.batches(widths, batch_size=16, budget=640)[1] == (320, [0, 2])
