"""The easyocr engine loads and reads with no network and HOME read-only, and writes
nothing but its graph in OCRFLEET_CACHE_DIR: the first process builds it there, the next
one loads it from there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.test_offline import _isolation_available
from tests.unit.test_ctc_engines import UW3

pytestmark = pytest.mark.integration

SCRIPT = """
import sys
from ocrfleet.config import Settings
from ocrfleet.engines import load_recognisers
from ocrfleet.pipeline.images import load_image
(reader,) = load_recognisers(Settings(engines=["easyocr"], onnx_threads=1))
crop = load_image(open(sys.argv[1], "rb").read())
print(reader.recognise([crop])[0][0])
"""


def test_easyocr_needs_no_network_and_writes_only_its_cache(tmp_path: Path) -> None:
    why = _isolation_available()
    if why is not None:
        pytest.skip(why)
    line = sorted(UW3.glob("*.png"))[:1] if UW3.is_dir() else []
    if not line:
        pytest.skip(f"no UW3 lines under {UW3}")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
    }
    script = f'mount -t tmpfs -o ro,size=1m tmpfs "$HOME" && exec {sys.executable} -c "$0" "$1"'
    truth = " ".join(line[0].with_suffix("").with_suffix(".gt.txt").read_text().split())
    for _ in range(2):  # builds the graph, then loads it
        done = subprocess.run(
            ["unshare", "-n", "-m", "sh", "-c", script, SCRIPT, str(line[0])],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == truth
    written = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    assert written and all(name.startswith("ocrfleet-cache/easyocr/") for name in written)
    assert list(home.iterdir()) == []
