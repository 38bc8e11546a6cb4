"""Rates measured over windows of time from what the scheduler samples each tick.

A pool's throughput is counted in finished units (pages for device workers, documents
split for ingest workers) and in busy worker-seconds: each tick samples the cumulative
count of finished units and the number of units running now, and a worker's rate is the
units finished over a window divided by the worker-seconds spent running in it. A long
page is busy time without a completion, so it lowers the rate in proportion to its length
(not to the number of heartbeats it spanned), and an idle worker lowers nothing.

Arrivals are counted the same way, from the cumulative count of units ever created. The
forecast of arrivals is the smaller of a short and a long window's average: a burst
lifts it only by its share of the long window and leaves it one short window after the
burst ends, so the pages of a burst, already in the backlog, are not counted again as
arrivals still to come.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE_MIN_DONE = 50  # a rate window reaches back until it holds this many completions


@dataclass(frozen=True)
class Sample:
    """One tick's cumulative counts for one pool."""

    at: float
    arrivals: int  # units ever created
    done: int  # units ever finished by a worker
    running: int  # units a worker was running at `at`


@dataclass(frozen=True)
class History:
    """The samples of the last `keep_s` seconds, oldest first."""

    samples: tuple[Sample, ...] = ()

    def add(self, sample: Sample, keep_s: float) -> History:
        kept = [s for s in self.samples if sample.at - s.at <= keep_s and s.at < sample.at]
        return History((*kept, sample))

    def worker_rate(self, window_s: float, min_done: int = RATE_MIN_DONE) -> float | None:
        """Units per busy worker-second over the last `window_s`, reaching further back
        (within what is kept) until the window holds `min_done` completions; None before
        any completion was seen."""
        samples = self.samples
        if len(samples) < 2:
            return None
        last = samples[-1]
        start = len(samples) - 1
        while start > 0 and (
            last.at - samples[start].at < window_s or last.done - samples[start].done < min_done
        ):
            start -= 1
        # Start where the completion before the window was seen, not just before the next
        # one: otherwise the window counts that page done with little of its busy time.
        while start > 0 and samples[start - 1].done == samples[start].done:
            start -= 1
        done, busy = 0, 0.0
        for a, b in zip(samples[start:], samples[start + 1 :], strict=False):
            done += max(0, b.done - a.done)  # a deleted document lowers the count: no work
            busy += a.running * (b.at - a.at)  # seen running: running until the next tick
        if done <= 0:
            return None
        # Units shorter than a tick may never be seen running: then one worker busy for
        # the whole window is the rate's lower bound.
        return done / (busy if busy > 0 else last.at - samples[start].at)

    def arrival_rate(self, short_s: float, long_s: float) -> float:
        """Units/s to expect: the smaller of the short and the long window's average. The
        long window divides by its full length, so history the scheduler has not seen yet
        counts as no arrivals."""
        return min(self._arrived(short_s) / short_s, self._arrived(long_s) / long_s)

    def _arrived(self, window_s: float) -> int:
        if not self.samples:
            return 0
        last = self.samples[-1]
        inside = [s for s in self.samples if last.at - s.at <= window_s]
        return max(0, last.arrivals - inside[0].arrivals)

    def last_arrival(self) -> float | None:
        """When the count of arrivals last grew (the tick that saw it), None if never."""
        for a, b in zip(reversed(self.samples[:-1]), reversed(self.samples), strict=False):
            if b.arrivals > a.arrivals:
                return b.at
        return None
