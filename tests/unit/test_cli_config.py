"""Configuration mistakes at the command line: every one exits 2 with one line naming what
to fix, and a misspelled OCRFLEET_* variable is named once, with the setting it resembles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ocrfleet.config import NOT_SETTINGS, unknown_variables
from tests.conftest import REPO

SCAN = REPO / "examples" / "scan.png"


def _ocrfleet(
    tmp_path: Path, args: list[str], env: dict[str, str], code: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`ocrfleet ARGS` (or `python -c CODE`) in an empty folder, with only `env` of the
    OCRFLEET_* variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRFLEET_")}
    clean |= {"OCRFLEET_DATABASE_URL": f"sqlite:///{tmp_path / 'fleet.db'}"} | env
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "ocrfleet.cli", *args]
    return subprocess.run(
        argv, cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=300
    )


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("env", "args", "named"),
    [
        ({"OCRFLEET_DATABASE_URL": "mysql://u:pw@db/ocr"}, ["status"], "OCRFLEET_DATABASE_URL"),
        ({"OCRFLEET_STORE_URL": "ftp://host/x"}, ["run", str(SCAN)], "OCRFLEET_STORE_URL"),
        ({"OCRFLEET_BROKER_URL": "amqp://host"}, ["status"], "OCRFLEET_BROKER_URL"),
        ({"OCRFLEET_CACHE_DIR": "{file}/cache"}, ["status"], "OCRFLEET_CACHE_DIR"),
        (
            {"OCRFLEET_ENGINES": "minicpm", "OCRFLEET_MINICPM_MODEL_PATH": "/no/such/model"},
            ["run", str(SCAN)],
            "OCRFLEET_MINICPM_MODEL_PATH",
        ),
    ],
    ids=["mysql-url", "store-scheme", "broker-scheme", "unwritable-cache", "missing-model"],
)
def test_a_configuration_error_exits_2_with_one_line(
    tmp_path: Path, env: dict[str, str], args: list[str], named: str
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    env = {k: v.format(file=a_file) for k, v in env.items()}
    done = _ocrfleet(tmp_path, args, env)
    assert done.returncode == 2, done.stderr
    line = _one_error_line(done)
    assert named in line and "configuration" in line
    assert "pw" not in line  # a password in a URL is not echoed
    assert not (tmp_path / "ocrfleet-store").exists()  # nothing was processed


def test_flower_without_the_monitoring_extra_says_what_to_install(tmp_path: Path) -> None:
    # Flower made unimportable the way Python marks a module as absent.
    code = (
        "import sys; sys.modules['flower'] = None\nfrom ocrfleet.cli import main; main(['flower'])"
    )
    done = _ocrfleet(tmp_path, [], {"OCRFLEET_BROKER_URL": "redis://127.0.0.1:1/0"}, code)
    assert done.returncode == 2
    assert "ocrfleet[monitoring]" in _one_error_line(done)


def test_an_unknown_variable_is_named_once_with_the_closest_setting(tmp_path: Path) -> None:
    code = (
        "from ocrfleet.config import get_settings\n"
        "get_settings(); get_settings.cache_clear(); get_settings()\n"
    )
    (tmp_path / ".env").write_text("OCRFLEET_ENIGNES=tesseract\n")
    done = _ocrfleet(tmp_path, [], {"OCRFLEET_DATABSE_URL": "sqlite:///x.db"}, code)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [
        "warning: OCRFLEET_DATABSE_URL is not an ocrfleet setting, ignored "
        "(did you mean OCRFLEET_DATABASE_URL?)",
        "warning: OCRFLEET_ENIGNES is not an ocrfleet setting, ignored "
        "(did you mean OCRFLEET_ENGINES?)",
    ]


def test_unknown_variables_spares_settings_and_the_tests_own() -> None:
    names = [
        "OCRFLEET_DATABASE_URL",
        "ocrfleet_dpi",  # pydantic-settings reads names in any case
        *NOT_SETTINGS,
        "OCRFLEET_ENIGNES",
        "OCRFLEET_ZZZ",
        "HOME",
    ]
    assert unknown_variables(names) == [
        ("OCRFLEET_ENIGNES", "OCRFLEET_ENGINES"),
        ("OCRFLEET_ZZZ", None),
    ]
