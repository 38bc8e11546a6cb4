"""Pages/min through the fleet against the bare engine loop, on the same pages and cores.

Fleet: a Redis of its own, a throwaway PostgreSQL database, moto's S3 server, and
`ocrfleet worker --queues gpu,ingest --devices cpu:N` (N workers, one pool process each);
every page goes client.submit -> S3 intake -> ingest task -> page image to S3 -> page
task -> rows in PostgreSQL. Timed from the first submit to the last document done, with
the workers already up and their models loaded.

Bare: the RapidOCR library itself (`rapidocr.RapidOCR` with its defaults, except the
text-direction classifier turned off as the fleet's RapidOCR engine has it: detect, then
recognise), in N spawned processes with the models loaded before the clock
starts, taking the same page images from one shared queue, with the same onnxruntime
thread budget per process as each fleet worker (the launcher's share for cpu:N). It has no
layout, scorer, queue, store or database: the ratio is what the fleet costs against the
engine it wraps.

Bare and fleet are interleaved (bare, fleet, bare, fleet, ...) `--repeats` times on fresh
copies of the pages, with the fleet's workers kept warm, so load on a shared machine hits
both sides alike; the median ratio and its spread are printed.

Queue overhead: single-page documents submitted one at a time to the idle fleet; the mean
time from `task-sent` to `task-started` of their page tasks (Celery task events).

    python bench/fleet_throughput.py [--pages 16] [--workers 2] [--repeats 3]

The last two lines read `queue overhead ms/page: X` and
`ratio fleet/bare: X.XX median of N (min X.XX, max X.XX)`.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import text  # noqa: E402

from bench.corpus import real_pages, tagged_png  # noqa: E402
from ocrfleet import client  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.db.migrate import upgrade  # noqa: E402
from ocrfleet.tasks.devices import parse_devices, thread_share  # noqa: E402
from tests.conftest import free_port, temporary_pg_database, wait_for_port  # noqa: E402
from tests.integration.fleet_helpers import (  # noqa: E402
    fleet_env,
    render_page,
    settings_from,
    start_workers,
    wait_finished,
)

# -- services ----------------------------------------------------------------------------


@contextmanager
def process(argv: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[None]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for_port(port)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def database() -> Iterator[str]:
    with temporary_pg_database("ocrfleet_bench") as url:
        try:
            upgrade(url)
            yield url
        finally:
            from ocrfleet.db.session import dispose_engines

            dispose_engines()


@contextmanager
def services(stack: ExitStack) -> Iterator[dict[str, str]]:
    import boto3

    redis_port, moto_port = free_port(), free_port()
    aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    os.environ.update({**aws, "AWS_DEFAULT_REGION": "us-east-1"})
    redis_argv = ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1"]
    stack.enter_context(process([*redis_argv, "--save", "", "--appendonly", "no"], redis_port))
    moto_argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)]
    stack.enter_context(process(moto_argv, moto_port, env={**os.environ}))
    endpoint = f"http://127.0.0.1:{moto_port}"
    bucket = "ocrfleet-bench"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    url = stack.enter_context(database())
    yield fleet_env(
        pg_url=url,
        broker_url=f"redis://127.0.0.1:{redis_port}/0",
        bucket=bucket,
        moto_endpoint=endpoint,
        OCRFLEET_DPI=str(Settings().dpi),
        OCRFLEET_TASK_SOFT_TIME_LIMIT="600",
        OCRFLEET_TASK_TIME_LIMIT="900",
        OCRFLEET_VISIBILITY_TIMEOUT="3600",
    )


# -- bare loop ---------------------------------------------------------------------------


def _bare_worker(
    threads: int,
    pages: list[bytes],
    todo: Any,
    ready: Any,
    go: Any,
    out: Any,
) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import numpy as np
    from rapidocr import RapidOCR

    from ocrfleet.pipeline.images import load_image

    engine = RapidOCR(
        params={
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "Global.use_cls": False,
            "Global.log_level": "warning",
        }
    )
    engine(np.asarray(load_image(pages[0])))  # warm-up, as the fleet's first page
    ready.release()
    go.wait()
    started = time.time()
    while True:
        index = todo.get()
        if index is None:
            break
        engine(np.asarray(load_image(pages[index])))
    out.put((started, time.time()))


def bare_rate(pages: list[bytes], workers: int, threads: int) -> float:
    """Pages/min of `workers` RapidOCR processes sharing one queue of the same pages."""
    ctx = mp.get_context("spawn")
    todo, out = ctx.Queue(), ctx.Queue()
    ready, go = ctx.Semaphore(0), ctx.Event()
    for index in range(len(pages)):
        todo.put(index)
    for _ in range(workers):
        todo.put(None)
    procs = [
        ctx.Process(target=_bare_worker, args=(threads, pages, todo, ready, go, out))
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.acquire()
    go.set()
    spans = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    return 60 * len(pages) / elapsed


# -- fleet -------------------------------------------------------------------------------


class TaskEvents:
    """task-sent and task-started timestamps by task id, captured from the broker."""

    def __init__(self, settings: Settings) -> None:
        from ocrfleet.tasks.app import create_app

        self.app = create_app(settings)
        self.sent: dict[str, tuple[str, float]] = {}
        self.started: dict[str, float] = {}
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._capture, daemon=True)
        self._thread.start()

    def _capture(self) -> None:
        def on_sent(event: dict[str, Any]) -> None:
            with self._lock:
                self.sent[event["uuid"]] = (event.get("name", ""), event["timestamp"])

        def on_started(event: dict[str, Any]) -> None:
            with self._lock:
                self.started[event["uuid"]] = event["timestamp"]

        handlers = {"task-sent": on_sent, "task-started": on_started, "*": lambda e: None}
        try:
            with self.app.connection_for_read() as conn:
                self._receiver = self.app.events.Receiver(conn, handlers=handlers)
                self._receiver.capture(limit=None, timeout=None, wakeup=False)
        except Exception:
            if not self._stopping.is_set():
                raise

    def close(self) -> None:
        self._stopping.set()
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)

    def page_waits(self, since: float) -> list[float]:
        """Enqueue -> start of every page task sent after `since`, in seconds."""
        with self._lock:
            return [
                self.started[task_id] - sent_at
                for task_id, (name, sent_at) in self.sent.items()
                if name == "ocrfleet.process_page" and sent_at >= since and task_id in self.started
            ]


def wait_models_loaded(log_path: Path, workers: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while log_path.read_text(errors="replace").count("models loaded in pool process") < workers:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"workers did not load their models:\n{log_path.read_text()[-4000:]}"
            )
        time.sleep(0.5)


def wait_all_finished(ids: list[int], database_url: str, fleet: Any, timeout: float = 3600) -> None:
    """One cheap query every 0.2 s, so the observer takes little of the cores it measures."""
    from ocrfleet.db.session import get_engine

    query = text(
        "SELECT count(*) FROM documents WHERE id = ANY(:ids) "
        "AND status IN ('done', 'partial', 'rejected', 'failed')"
    )
    deadline = time.monotonic() + timeout
    with get_engine(database_url).connect() as conn:
        while conn.execute(query, {"ids": ids}).scalar() < len(ids):
            conn.rollback()  # a fresh snapshot each time
            if fleet.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fleet stopped or timed out:\n{fleet.log_tail()}")
            time.sleep(0.2)


class Fleet:
    """`ocrfleet worker --devices cpu:N` kept warm across repeats."""

    def __init__(self, pages: list[bytes], env: dict[str, str], workers: int, workdir: Path):
        self.env = env
        self.settings = settings_from(env)
        log_path = workdir / "workers.log"
        self.proc = start_workers(
            env, log_path, queues="gpu,ingest", devices=f"cpu:{workers}", events=True
        )
        wait_models_loaded(log_path, workers)
        self.events = TaskEvents(self.settings)
        time.sleep(1.0)  # the event receiver is subscribed
        # One warm-up page per worker: each pool process computes its run id once.
        warm = [
            client.submit(tagged_png(pages[0], f"warm-up-{i}"), settings=self.settings)
            for i in range(workers)
        ]
        wait_finished(warm, self.settings, 600, self.proc)

    def rate(self, pages: list[bytes], tag: str) -> tuple[float, float]:
        """(pages/min, mean enqueue->start ms during the run) on fresh copies of `pages`.

        The backlog sits in the ingest queue: workers take page tasks first, so a page
        waits only for the next free worker."""
        inputs = [tagged_png(data, f"{tag}-page-{i}") for i, data in enumerate(pages)]
        since = time.time()
        started = time.perf_counter()
        ids = [client.submit(data, settings=self.settings) for data in inputs]
        wait_all_finished(ids, self.settings.database_url, self.proc)
        elapsed = time.perf_counter() - started
        states = wait_finished(ids, self.settings, 60, self.proc)
        bad = [s for s in states if s.status.value != "done"]
        if bad:
            raise RuntimeError(f"documents not done: {[(s.id, s.status, s.reason) for s in bad]}")
        backlog = self.events.page_waits(since)
        return 60 * len(pages) / elapsed, 1000 * sum(backlog) / max(1, len(backlog))

    def idle_overhead_ms(self) -> float:
        """One page at a time into the idle fleet: the queue's own overhead."""
        probe_since = time.time()
        for i in range(8):
            doc = client.submit(_probe_page(i), settings=self.settings)
            wait_finished([doc], self.settings, 600, self.proc)
        time.sleep(1.0)
        idle = self.events.page_waits(probe_since)
        if not idle:
            raise RuntimeError("no task events captured: are the workers sending events?")
        return 1000 * sum(idle) / len(idle)

    def close(self) -> None:
        self.events.close()
        self.proc.stop()


def _probe_page(i: int) -> bytes:
    image = render_page([f"probe page {i}", f"latency {1000 + i}"])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    threads = thread_share(parse_devices(f"cpu:{args.workers}"))
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")
    ratios, backlogs = [], []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        env = stack.enter_context(services(stack))
        settings = settings_from(env)
        pages = real_pages(settings, args.pages)
        fleet = Fleet(pages, env, args.workers, Path(tmp))
        stack.callback(fleet.close)
        print(
            f"pages: {len(pages)} at {settings.dpi} dpi, {args.workers} workers x "
            f"{threads} thread(s), {args.repeats} interleaved repeats"
        )
        for repeat in range(args.repeats):
            bare = bare_rate(pages, args.workers, threads)
            rate, backlog_ms = fleet.rate(pages, f"r{repeat}")
            ratios.append(rate / bare)
            backlogs.append(backlog_ms)
            print(
                f"repeat {repeat + 1}: bare rapidocr {bare:.1f} pages/min, fleet {rate:.1f} "
                f"pages/min, ratio {rate / bare:.2f}"
            )
        idle_ms = fleet.idle_overhead_ms()
    print(f"enqueue -> start during the throughput runs: {statistics.median(backlogs):.1f} ms/page")
    print(f"queue overhead ms/page: {idle_ms:.1f}")
    print(
        f"ratio fleet/bare: {statistics.median(ratios):.2f} median of {len(ratios)} "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
