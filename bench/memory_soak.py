"""A page worker's resident memory over many pages: does it stay flat?

Starts a real fleet on this machine: its own redis-server on a free port, a SQLite database
and a local store in a temporary folder, and one `ocrfleet worker --queues gpu,ingest
--devices cpu:1` (one Celery page worker on the CPU engine, plus the ingest child). Then
submits `--pages` small real page images (realdocs' phototest and eurotext and the bundled
examples' scan and photo, cycled, each with its own PNG text chunk so nothing is deduped)
in batches of `--every`, and after each batch is done samples the page worker process (the
largest process of the launcher's tree: it holds the models):

- its resident memory between pages (what it keeps: a leak or a heap that is not given
  back shows here). A sample taken while a page is being read says more about which stage
  it caught than about a drift, so the next batch is sent only after the sample;
- its peak while reading the batch (`VmHWM`, reset after each sample).

Prints the series, and whether the samples between pages after `--warmup` pages stay
within 10% of each other ((max - min) / min); the peaks' spread is printed beside it.

    python bench/memory_soak.py [--pages 500] [--every 50] [--warmup 100]
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from PIL import Image  # noqa: E402

from bench.corpus import REALDOCS, tagged_png  # noqa: E402
from ocrfleet import client  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.db.migrate import upgrade  # noqa: E402
from ocrfleet.memory import peak_mb, rss_mb  # noqa: E402

SOURCES = [
    REALDOCS / "tesseract_test" / "phototest.tif",
    REALDOCS / "tesseract_test" / "eurotext.tif",
    REPO / "examples" / "scan.png",
    REPO / "examples" / "photo.jpg",
]
FLAT = 0.10
SETTLE_S = 2.0  # after a batch's last page is stored, the worker gives its heap back


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def page_pngs() -> list[bytes]:
    pngs = []
    for source in SOURCES:
        out = io.BytesIO()
        Image.open(source).convert("RGB").save(out, format="PNG")
        pngs.append(out.getvalue())
    return pngs


def tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                with suppress(OSError):
                    todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def pages_done(database_url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    with engine.connect() as conn:
        done = conn.execute(text("SELECT count(*) FROM pages WHERE status != 'pending'"))
        count = int(done.scalar_one())
    engine.dispose()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    # A `timeout` or Ctrl-C still stops the worker and redis-server it started (below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with tempfile.TemporaryDirectory(prefix="ocrfleet-soak-") as tmp:
        root = Path(tmp)
        port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(root)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        env = {
            **os.environ,
            "OCRFLEET_DATABASE_URL": f"sqlite:///{root / 'ocrfleet.db'}",
            "OCRFLEET_STORE_URL": f"file://{root / 'store'}",
            "OCRFLEET_BROKER_URL": f"redis://127.0.0.1:{port}/0",
            "OCRFLEET_CACHE_DIR": str(root / "cache"),
            "OCRFLEET_WORKER_MAX_TASKS": str(args.pages * 10),  # no recycling: we watch it
        }
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            **{k.removeprefix("OCRFLEET_").lower(): v for k, v in env.items() if "OCRFLEET_" in k},
        )
        upgrade(settings.database_url)
        log = open(root / "worker.log", "wb")  # noqa: SIM115 - closed below
        worker = subprocess.Popen(
            [sys.executable, "-m", "ocrfleet.cli", "worker", "--queues", "gpu,ingest",
             "--devices", "cpu:1", "--loglevel", "warning"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            pngs = page_pngs()
            started = time.monotonic()
            series: list[tuple[int, float, float]] = []
            for first in range(0, args.pages, args.every):
                last = min(args.pages, first + args.every)
                for n in range(first, last):
                    client.submit(tagged_png(pngs[n % len(pngs)], f"soak-{n}"), settings=settings)
                while (done := pages_done(settings.database_url)) < last:
                    if worker.poll() is not None:
                        raise SystemExit((root / "worker.log").read_text()[-3000:])
                    time.sleep(0.5)
                time.sleep(SETTLE_S)
                page_worker = max(tree(worker.pid), key=rss_mb)
                rss, peak = rss_mb(page_worker), peak_mb(page_worker)
                series.append((done, rss, peak))
                minutes = (time.monotonic() - started) / 60
                print(
                    f"pages {done:4d}: page worker RSS {rss:7.1f} MB between pages, "
                    f"peak {peak:7.1f} MB ({minutes:.1f} min)"
                )
                sys.stdout.flush()
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for pid in tree(worker.pid):
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            log.close()
            redis.kill()
            redis.wait(timeout=10)
    after = [(rss, peak) for done, rss, peak in series if done >= args.warmup]
    if not after:
        print("no samples after the warm-up")
        return
    rss, peaks = [r for r, _ in after], [p for _, p in after]
    spread = (max(rss) - min(rss)) / min(rss)
    verdict = "flat" if spread <= FLAT else "NOT flat"
    print(
        f"after {args.warmup} pages: RSS between pages {min(rss):.1f}..{max(rss):.1f} MB, "
        f"spread {spread:.1%}: {verdict} (within {FLAT:.0%}); peaks {min(peaks):.1f}.."
        f"{max(peaks):.1f} MB, spread {(max(peaks) - min(peaks)) / min(peaks):.1%}"
    )


if __name__ == "__main__":
    main()
