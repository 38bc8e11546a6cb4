"""A recogniser's model calls side by side, each on few threads.

A batch of line crops is a small tensor, and onnxruntime's intra-op threads share it out
poorly: on this project's 2-core machine, 263 real line crops (two UNLV scans, three
receipts) read in 7.6 s on one thread, 5.6 s on two intra-op threads (1.35x), and 3.9 s as
two one-thread calls at once (1.95x); EasyOCR's CRNN 9.1, 5.5 and 4.7 s. So a recogniser
splits its thread budget into calls at once (`plan`) and runs its independent calls
(`run`) on that many threads: each call releases the GIL inside the runtime. A crop's text
depends on that crop alone (see `RapidRecogniser`), so this changes no output.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Calls at once, at most: each holds its own activations, so a wide machine gives a call
# more intra-op threads instead of more calls.
MAX_CALLS = 4


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def plan(threads: int | None) -> tuple[int, int]:
    """(calls at once, intra-op threads per call) for a budget of `threads` CPUs (None:
    the CPUs this process may use)."""
    budget = max(1, threads or available_cpus())
    calls = min(budget, MAX_CALLS)
    return calls, budget // calls


def batches(widths: Sequence[int], batch_size: int, budget: int) -> list[tuple[int, list[int]]]:
    """The model calls of a recogniser's crops, as (input width, crop indices): crops of
    one input width share a call, at most `batch_size` of them and `budget` columns in all
    (a crop wider than the budget is read alone), narrowest first."""
    by_width: dict[int, list[int]] = {}
    for i, width in enumerate(widths):
        by_width.setdefault(width, []).append(i)
    out: list[tuple[int, list[int]]] = []
    for width, ids in sorted(by_width.items()):
        step = max(1, min(batch_size, budget // width))
        out += [(width, ids[start : start + step]) for start in range(0, len(ids), step)]
    return out


def run(calls: Sequence[Callable[[], T]], costs: Sequence[int], workers: int) -> list[T]:
    """Each call's result, in the calls' order; up to `workers` at once, the costliest
    started first so that the workers finish together."""
    if workers <= 1 or len(calls) <= 1:
        return [call() for call in calls]
    order = sorted(range(len(calls)), key=lambda i: -costs[i])
    with ThreadPoolExecutor(min(workers, len(calls)), thread_name_prefix="ocrfleet-call") as pool:
        futures = {i: pool.submit(calls[i]) for i in order}
        return [futures[i].result() for i in range(len(calls))]
