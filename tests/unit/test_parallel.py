"""`ocrfleet run --jobs`: each worker's share of the cores, and the peak memory of a process
tree (a real child process that holds memory)."""

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
