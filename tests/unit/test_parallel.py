"""`ocrfleet run --jobs`: each worker's share of the cores, and the peak memory of a process
tree (a real child process that holds memory, counted once when it has not exec'd)."""

from __future__ import annotations

import subprocess
import sys

from ocrfleet.config import Settings
from ocrfleet.memory import PeakRss, rss_mb, tree_rss_mb
from ocrfleet.parallel import available_cpus, worker_settings

SETTINGS = Settings(_env_file=None)  # type: ignore[call-arg]


def test_workers_share_the_cores() -> None:
    assert worker_settings(SETTINGS, 2, cpus=8).onnx_threads == 4
    assert worker_settings(SETTINGS, 3, cpus=8).onnx_threads == 2
    assert worker_settings(SETTINGS, 16, cpus=8).onnx_threads == 1
    pinned = SETTINGS.model_copy(update={"onnx_threads": 3})
    assert worker_settings(pinned, 2, cpus=8).onnx_threads == 3
    assert available_cpus() >= 1


def test_the_peak_counts_a_child_holding_memory() -> None:
    hold = "import sys, time; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); "
    hold += "print('ready', flush=True); time.sleep(2)"
    with PeakRss(interval_s=0.05) as peak:
        child = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        assert tree_rss_mb() >= rss_mb() + 300
        child.wait(timeout=30)
    assert peak.peak_mb >= 300


# In a fresh interpreter (the test process has children of its own: servers the fixtures
# started): hold 300 MB, fork a child that never execs, and print the child's own RSS, the
# tree's and the parent's.
FORKED = """
import os
from ocrfleet.memory import rss_mb, tree_rss_mb
held = bytearray(300 << 20)
held[::4096] = b"x" * len(held[::4096])
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(write_end)
    os.read(read_end, 1)  # returns once the parent closes its end
    os._exit(0)
print(rss_mb(pid), tree_rss_mb(), rss_mb(), flush=True)
os.close(write_end)
os.waitpid(pid, 0)
"""


def test_a_child_that_has_not_exec_d_is_not_its_parents_memory_twice() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, check=True, timeout=60
    )
    child, tree, parent = (float(v) for v in done.stdout.split())
    assert child >= 300  # its own RSS counts the parent's pages, shared copy-on-write
    assert tree < parent + 100


def test_workers_take_the_largest_pages_first(tmp_path) -> None:
    """A three-page TIFF whose middle page is the largest: the pool is given it first."""
    from PIL import Image

    from ocrfleet.db.migrate import upgrade
    from ocrfleet.db.session import dispose_engines
    from ocrfleet.parallel import _largest_first
    from ocrfleet.service import Context, ingest

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=f"sqlite:///{tmp_path / 'ocrfleet.db'}",
        store_url=f"file://{tmp_path / 'store'}",
    )
    upgrade(settings.database_url)
    pages = [Image.new("RGB", size, "white") for size in ((300, 400), (900, 1200), (600, 800))]
    pages[0].save(tmp_path / "three.tif", save_all=True, append_images=pages[1:])
    ctx = Context(settings)
    try:
        outcome = ingest(ctx, str(tmp_path / "three.tif"))
        first, second, third = outcome.page_ids
        assert _largest_first(ctx, outcome.page_ids) == [second, third, first]
    finally:
        dispose_engines()


def test_workers_started_early_serve_the_run_or_are_shut_down() -> None:
    """`run --jobs 2` spawns its workers while the inputs are split; the run takes that pool
    when it has the pages for both, and a run left with fewer shuts it down."""
    from ocrfleet.parallel import Workers

    workers = Workers(SETTINGS, 2)
    assert workers.take(2) is None  # never started
    workers.start()
    pool = workers.take(2)
    assert pool is not None and workers.take(2) is None  # taken once
    with pool:
        assert pool.submit(available_cpus).result(timeout=120) >= 1
    workers.start()
    started = workers.pool
    assert workers.take(1) is None
    assert started is not None and started._shutdown_thread  # type: ignore[attr-defined]
