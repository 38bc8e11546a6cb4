"""An installed ocrfleet (`pipx install .`, a wheel) carries what `ocrfleet db upgrade`
needs: the Alembic migrations ship inside the package.

The wheel is built from a copy of the sources and installed with `--no-deps` into a fresh
virtualenv; its dependencies come from this project's virtualenv through a `.pth` line
(offline, and without the editable install's path hook, which that line does not run), so
the `ocrfleet` that runs is the wheel's and nothing of the checkout is on its path.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path

from alembic.script import ScriptDirectory

from ocrfleet.db.migrate import MIGRATIONS
from tests.conftest import REPO


def _build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    shutil.copytree(
        REPO / "ocrfleet", source / "ocrfleet", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + [str(source), "-w", str(out)],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("ocrfleet-*.whl")
    return wheel


def _venv_with(wheel: Path, root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
        + ["--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "ocrfleet-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return root / "bin"


def test_a_wheel_upgrades_a_fresh_database(tmp_path: Path) -> None:
    bin_dir = _venv_with(_build_wheel(tmp_path), tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OCRFLEET_", "PYTHON"))}
    env |= {
        "OCRFLEET_DATABASE_URL": f"sqlite:///{work / 'fleet.db'}",
        "OCRFLEET_CACHE_DIR": str(work / "cache"),
    }

    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import ocrfleet; print(ocrfleet.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(tmp_path / "venv"), where

    for command in (["db", "upgrade"], ["db", "check"]):
        done = subprocess.run(
            [str(bin_dir / "ocrfleet"), *command],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    with sqlite3.connect(work / "fleet.db") as db:
        versions = [row[0] for row in db.execute("SELECT version_num FROM alembic_version")]
    assert versions == ScriptDirectory(str(MIGRATIONS)).get_heads()
