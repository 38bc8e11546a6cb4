"""`ocrfleet run --jobs N`: the pages of a run read in N worker processes, like OCRmyPDF's
`--jobs`.

Each worker is a fresh (spawned) process that loads the models once and then takes pages
one at a time; it reads a page exactly as the run's own process would (`run_page`), so one
job or N make the same rows but for timings. A worker writes its page itself: SQLite runs
in WAL mode and every write transaction takes the lock up front and waits for it
(`ocrfleet.db.session`), so N writers queue instead of failing. Each worker gets
`cores // N` onnxruntime (and OpenMP) threads, so N workers do not oversubscribe the cores,
unless `OCRFLEET_ONNX_THREADS` says otherwise. A worker that dies (killed, out of memory)
takes only its pool down: the pages still pending are read again in a new pool, and after
a second loss they fail with the reason instead of looping.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.engines.calls import available_cpus

if TYPE_CHECKING:
    from ocrfleet.service import Context

__all__ = ["Workers", "available_cpus", "run_pages", "worker_settings"]

POOL_LOSSES = 2  # pools lost under a page before it fails
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT", "OPENBLAS_NUM_THREADS")
_worker: Context | None = None  # the worker process's context, models loaded

OnDone = Callable[[int, ir.PageStatus], None]


def worker_settings(settings: Settings, jobs: int, cpus: int | None = None) -> Settings:
    """The settings of one of `jobs` workers: a fair share of the cores each, unless the
    thread count is set. Thread counts change no output and are not part of run_id."""
    if settings.onnx_threads is not None:
        return settings
    threads = max(1, (cpus or available_cpus()) // jobs)
    return settings.model_copy(update={"onnx_threads": threads})


class Workers:
    """`jobs` worker processes that may be started before the pages are known (`start`):
    spawning them and loading their models then overlaps the split of the inputs."""

    def __init__(self, settings: Settings, jobs: int) -> None:
        self.settings = worker_settings(settings, jobs)
        self.jobs = jobs
        self.pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Spawn every worker now (each runs a call that does nothing, after it has loaded
        its models)."""
        if self.pool is not None:
            return
        self.pool = _new_pool(self.settings, self.jobs)
        for _ in range(self.jobs):
            self.pool.submit(_ready)

    def take(self, jobs: int) -> ProcessPoolExecutor | None:
        """The started pool, for `jobs` workers of these settings; None where it was not
        started or is not that pool (it is shut down)."""
        pool, self.pool = self.pool, None
        if pool is not None and jobs != self.jobs:
            pool.shutdown(wait=False, cancel_futures=True)
            return None
        return pool


def run_pages(
    ctx: Context,
    page_ids: Sequence[int],
    jobs: int,
    on_done: OnDone,
    workers: Workers | None = None,
) -> None:
    """Read every page (`run_page`: a failure fails that page alone), in this process when
    `jobs` is 1, else in `jobs` worker processes (`workers`' where they were started);
    `on_done(page_id, status)` after each."""
    from ocrfleet.service import fail_page, run_page

    jobs = min(jobs, len(page_ids))
    started = workers.take(jobs) if workers is not None else None
    if jobs <= 1:
        for page_id in page_ids:
            on_done(page_id, run_page(ctx, page_id))
        return
    settings = worker_settings(ctx.settings, jobs)
    todo = _largest_first(ctx, page_ids)
    for loss in range(1, POOL_LOSSES + 1):
        todo = _pool(settings, todo, min(jobs, len(todo)), on_done, started)
        started = None
        if not todo:
            return
        if loss == POOL_LOSSES:
            for page_id in _still_pending(ctx, todo):
                reason = f"a worker process died while reading it ({loss} times)"
                fail_page(ctx, page_id, reason)
                on_done(page_id, ir.PageStatus.failed)
        else:
            todo = _still_pending(ctx, todo)


def _pool(
    settings: Settings,
    page_ids: list[int],
    jobs: int,
    on_done: OnDone,
    started: ProcessPoolExecutor | None = None,
) -> list[int]:
    """Run the pages in one pool (`started`, or a new one); returns those left unfinished
    by a lost pool."""
    left: list[int] = []
    with started or _new_pool(settings, jobs) as pool:
        running: dict[Future[str], int] = {pool.submit(_read_page, p): p for p in page_ids}
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                page_id = running.pop(future)
                try:
                    on_done(page_id, ir.PageStatus(future.result()))
                except BrokenProcessPool:
                    left.append(page_id)
    return left


def _new_pool(settings: Settings, jobs: int) -> ProcessPoolExecutor:
    spawn = multiprocessing.get_context("spawn")  # fork would copy threads and connections
    return ProcessPoolExecutor(
        max_workers=jobs, mp_context=spawn, initializer=_start_worker, initargs=(settings,)
    )


def _largest_first(ctx: Context, page_ids: Sequence[int]) -> list[int]:
    """The pages by size, largest first: a worker takes the next page when it is free, so
    a large page left for last would keep one worker busy while the others sit idle."""
    from sqlalchemy import select

    from ocrfleet.db import models

    with ctx.session() as session:
        area = dict(
            session.execute(
                select(models.Page.id, models.Page.width * models.Page.height).where(
                    models.Page.id.in_(page_ids)
                )
            ).all()
        )
    return sorted(page_ids, key=lambda page_id: -(area.get(page_id) or 0))


def _still_pending(ctx: Context, page_ids: list[int]) -> list[int]:
    from sqlalchemy import select

    from ocrfleet.db import models

    with ctx.session() as session:
        pending = set(
            session.scalars(
                select(models.Page.id).where(
                    models.Page.id.in_(page_ids), models.Page.status == ir.PageStatus.pending
                )
            )
        )
    return [page_id for page_id in page_ids if page_id in pending]


def _start_worker(settings: Settings) -> None:
    """In each worker, before its first page: thread limits (before any numeric library
    loads), offline flags, the log file, and the models, once."""
    global _worker
    threads = str(settings.onnx_threads)
    for variable in _THREAD_VARIABLES:
        os.environ[variable] = threads
    from ocrfleet.cli import prepare_process
    from ocrfleet.service import Context

    prepare_process()
    _worker = Context(settings)
    _worker.toolkit  # noqa: B018  (load the models now, not in the first page's time)


def _ready() -> None:
    """Nothing: a call that makes the pool spawn a worker (which loads its models first)."""


def _read_page(page_id: int) -> str:
    from ocrfleet.service import run_page

    assert _worker is not None, "the worker was not started"
    return run_page(_worker, page_id).value
