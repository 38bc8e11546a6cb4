"""Shared pieces of the fleet tests: small rendered PDFs, worker processes started the way
an operator starts them (`ocrfleet worker ...`), and row counts that show nothing was
written twice."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from sqlalchemy import text

from ocrfleet import client
from ocrfleet.config import Settings
from ocrfleet.db.session import get_engine
from tests.conftest import REPO, free_port, port_open

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
PAGE_DPI = 100  # render and OCR at low resolution: these tests are about delivery
WORDS = ["invoice", "harbour", "seventeen", "granite", "meadow", "copper", "lantern", "orbit"]


def page_lines(doc: int, page: int) -> list[str]:
    """Two short lines with a token unique to (doc, page), so every page differs."""
    word = WORDS[(doc + page) % len(WORDS)]
    return [f"Page {page} of file {doc}", f"{word} {doc * 100 + page}"]


def render_page(lines: list[str]) -> Image.Image:
    image = Image.new("RGB", (420, 150), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype(FONT, 26)
    for row, line in enumerate(lines):
        draw.text((24, 24 + row * 56), line, fill="black", font=font)
    return image


def make_pdf(pages: list[list[str]]) -> bytes:
    """A PDF whose pages are the given lines rendered at PAGE_DPI."""
    images = [render_page(lines) for lines in pages]
    buffer = io.BytesIO()
    images[0].save(
        buffer, "PDF", save_all=True, append_images=images[1:], resolution=float(PAGE_DPI)
    )
    return buffer.getvalue()


def make_document(doc: int, pages: int) -> bytes:
    return make_pdf([page_lines(doc, page) for page in range(1, pages + 1)])


def fleet_env(
    *,
    pg_url: str,
    broker_url: str,
    bucket: str,
    moto_endpoint: str,
    **extra: str,
) -> dict[str, str]:
    """OCRFLEET_* variables for the workers; `settings_from(env)` gives the test's view."""
    env = {
        "OCRFLEET_DATABASE_URL": pg_url,
        "OCRFLEET_STORE_URL": f"s3://{bucket}/fleet",
        "OCRFLEET_S3_ENDPOINT_URL": moto_endpoint,
        "OCRFLEET_BROKER_URL": broker_url,
        "OCRFLEET_ENGINES": "rapidocr",
        "OCRFLEET_SCORER": "consensus",
        "OCRFLEET_DPI": str(PAGE_DPI),
        "OCRFLEET_MAX_DELIVERIES": "3",
        "OCRFLEET_TASK_SOFT_TIME_LIMIT": "60",
        "OCRFLEET_TASK_TIME_LIMIT": "75",
        "OCRFLEET_VISIBILITY_TIMEOUT": "90",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    env.update(extra)
    return env


def settings_from(env: dict[str, str]) -> Settings:
    values = {
        key.removeprefix("OCRFLEET_").lower(): value
        for key, value in env.items()
        if key.startswith("OCRFLEET_")
    }
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@dataclass
class Workers:
    """An `ocrfleet worker` launcher process and its log."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    _log: object = field(repr=False, default=None)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM (warm shutdown), then SIGKILL to whatever is left of the process tree."""
        tree = descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pid in tree + descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return self.proc.returncode


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) == pid:
            found.append(int(entry.name))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    result: list[int] = []
    frontier = [pid]
    while frontier:
        kids = children_of(frontier.pop())
        result += kids
        frontier += kids
    return result


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(): value.decode(errors="replace") for key, value in pairs}


def process_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a process the tests start: theirs plus the fleet's settings."""
    return {
        **os.environ,
        **env,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_THREAD_LIMIT": "1",
    }


def ocrfleet_cli(env: dict[str, str], *args: str, timeout: float = 600, expect: int = 0) -> str:
    """Run `ocrfleet ARGS...` (the real CLI module); returns its stdout, fails unless it
    exits `expect`."""
    done = subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", *args],
        cwd=REPO,
        env=process_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == expect, f"ocrfleet {' '.join(args)}: {done.returncode}\n{done.stderr}"
    return done.stdout


@contextlib.contextmanager
def api_process(
    env: dict[str, str], log_path: Path, timeout: float = 90, args: Iterable[str] = ()
) -> Iterator[str]:
    """`ocrfleet api [ARGS]` for the fleet of `env` on a free port, logging to `log_path`:
    its base URL once it answers (the log's tail if it exits or is still silent after
    `timeout` seconds), stopped afterwards."""
    port = free_port()
    with open(log_path, "ab") as log:
        api = subprocess.Popen(
            [sys.executable, "-m", "ocrfleet.cli", "api", "--port", str(port), *args],
            cwd=REPO,
            env=process_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + timeout
        while not port_open(port):
            if api.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"ocrfleet api did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        api.terminate()
        api.wait(timeout=30)


def start_workers(
    env: dict[str, str],
    log_path: Path,
    *,
    queues: str = "gpu,ingest",
    devices: str = "cpu:2",
    include: Iterable[str] = (),
    events: bool = False,
    concurrency: int | None = None,
    extra: Iterable[str] = (),
) -> Workers:
    """`ocrfleet worker ...` (as `python -m ocrfleet.cli`, the console script's module)."""
    argv = [sys.executable, "-m", "ocrfleet.cli", "worker", "--queues", queues, *extra]
    argv += ["--devices", devices, "--loglevel", "info"]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    for module in include:
        argv += ["--include", module]
    if events:
        argv.append("--events")
    full_env = process_env(env)
    log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Workers(proc, log_path, log)


def wait_finished(
    ids: list[int], settings: Settings, timeout: float, workers: Workers | None = None
) -> list[client.DocumentState]:
    deadline = time.monotonic() + timeout
    while True:
        states = [client.status(doc_id, settings=settings) for doc_id in ids]
        if all(state.finished for state in states):
            return states
        if workers is not None and workers.proc.poll() is not None:
            raise AssertionError(f"the workers exited early:\n{workers.log_tail()}")
        if time.monotonic() > deadline:
            pending = [(s.id, s.status.value, s.pages_done, s.page_count) for s in states]
            tail = workers.log_tail() if workers else ""
            raise AssertionError(f"not finished after {timeout}s: {pending}\n{tail}")
        time.sleep(0.5)


def scalar(url: str, sql: str, **params: object) -> object:
    with get_engine(url).connect() as conn:
        return conn.execute(text(sql), params).scalar()


def rows(url: str, sql: str, **params: object) -> list[tuple[object, ...]]:
    with get_engine(url).connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql), params)]


def assert_written_once(url: str, engines: int = 1) -> None:
    """Exactly one row per natural key at every level, and every page complete."""
    checks = {
        "documents": (
            "SELECT count(*) FROM documents",
            "SELECT count(DISTINCT (sha256, run_id)) FROM documents",
        ),
        "pages": (
            "SELECT count(*) FROM pages",
            "SELECT count(DISTINCT (document_id, number)) FROM pages",
        ),
        "regions": (
            "SELECT count(*) FROM regions",
            "SELECT count(DISTINCT (page_id, number)) FROM regions",
        ),
        "candidates": (
            "SELECT count(*) FROM candidates",
            "SELECT count(DISTINCT (region_id, engine)) FROM candidates",
        ),
        "scores": (
            "SELECT count(*) FROM scores",
            "SELECT count(DISTINCT (candidate_id, scorer)) FROM scores",
        ),
    }
    for table, (total, distinct) in checks.items():
        assert scalar(url, total) == scalar(url, distinct), f"duplicate rows in {table}"
    # Every region has one candidate per engine, every candidate one score.
    assert scalar(url, "SELECT count(*) FROM candidates") == engines * scalar(
        url, "SELECT count(*) FROM regions"
    )
    assert scalar(url, "SELECT count(*) FROM scores") == scalar(
        url, "SELECT count(*) FROM candidates"
    )
    # Pages per document agree with the document's own counters.
    mismatched = rows(
        url,
        "SELECT d.id FROM documents d JOIN pages p ON p.document_id = d.id "
        "GROUP BY d.id, d.page_count, d.pages_done, d.pages_failed "
        "HAVING count(p.id) <> d.page_count "
        "OR count(*) FILTER (WHERE p.status = 'done') <> d.pages_done "
        "OR count(*) FILTER (WHERE p.status = 'failed') <> d.pages_failed",
    )
    assert mismatched == [], f"page counters disagree for documents {mismatched}"


def page_texts(url: str, document_id: int) -> dict[int, str]:
    """Recognised text per page number, regions in reading order."""
    result: dict[int, list[str]] = {}
    for number, value in rows(
        url,
        "SELECT p.number, c.text FROM pages p JOIN regions r ON r.page_id = p.id "
        "JOIN candidates c ON c.region_id = r.id WHERE p.document_id = :doc "
        "ORDER BY p.number, r.number",
        doc=document_id,
    ):
        result.setdefault(int(number), []).append(str(value))
    return {number: " ".join(parts) for number, parts in result.items()}


def queue_depths(broker_url: str) -> dict[str, int]:
    """Messages waiting in each queue and unacknowledged, straight from Redis."""
    import redis

    conn = redis.Redis.from_url(broker_url)
    try:
        depths = {
            name: int(conn.llen(name)) for name in ("gpu.high", "gpu", "ingest.high", "ingest")
        }
        depths["unacked"] = int(conn.hlen("unacked"))
        return depths
    finally:
        conn.close()
