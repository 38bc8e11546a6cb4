"""Offline-clean: `ocrfleet run examples/` in a network namespace with no interfaces
(`unshare -n`) and with HOME on a read-only file system succeeds, and writes nothing
outside its working directory (database, store and OCRFLEET_CACHE_DIR all live there)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def _isolation_available() -> str | None:
    """Why the test cannot run here, or None."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "unshare -n -m needs root"
    probe = subprocess.run(["unshare", "-n", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -n -m is not permitted here: {probe.stderr.strip()}"
    return None


def test_run_needs_no_network_and_no_home(tmp_path: Path) -> None:
    why = _isolation_available()
    if why is not None:
        pytest.skip(why)
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "OMP_THREAD_LIMIT": "1",
        "LANG": "C.UTF-8",
    }
    # A private mount namespace: HOME becomes an empty read-only tmpfs, so any write there
    # fails (root ignores file modes, not a read-only mount); no interface, not even lo.
    script = (
        f'mount -t tmpfs -o ro,size=1m tmpfs "$HOME" && '
        f"exec {sys.executable} -m ocrfleet.cli run {REPO / 'examples'}"
    )
    done = subprocess.run(
        ["unshare", "-n", "-m", "sh", "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "4 done" in done.stdout
    names = {p.name for p in work.iterdir()}
    assert {"ocrfleet-cache", "ocrfleet-store", "ocrfleet.db"} <= names
    assert all(name.startswith("ocrfleet") for name in names), names
    assert list(home.iterdir()) == []  # and outside the namespace, nothing landed either
