"""run_id's parts: every setting that changes an outcome enters it, a library no configured
part uses does not, and `ocrfleet run-id` prints it and refuses a pin it does not match."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from ocrfleet.config import Settings
from ocrfleet.engines import engine_libraries
from ocrfleet.runs import run_config, run_id_of
from ocrfleet.scorers import scorer_libraries
from tests import client_venv
from tests.conftest import REPO

BASE = Settings(_env_file=None)  # type: ignore[call-arg]


def run_of(**changes: object) -> str:
    return run_id_of(run_config(BASE.model_copy(update=changes)))


@lru_cache(maxsize=1)
def base_run() -> str:
    return run_of()


@pytest.mark.parametrize(
    "change",
    [
        {"precheck_min_side_px": 5},
        {"precheck_max_text_chars": 100},
        {"engine_timeout_s": 30.0},
        {"max_pages": 10},
        {"max_pixels": 1_000_000},
        {"orientation_min_confidence": 0.9},
        {"det_text_height": 0},
        {"det_text_height": 20},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_setting_that_changes_an_outcome_changes_the_run(change: dict) -> None:
    assert run_of(**change) != base_run()


def test_settings_that_change_no_output_keep_the_run() -> None:
    assert run_of(render_timeout_s=5.0, onnx_threads=1, task_time_limit=30) == base_run()


def test_only_the_libraries_the_configured_parts_use() -> None:
    libraries = run_config(BASE)["libraries"]
    assert "torch" not in libraries and "transformers" not in libraries
    assert {"onnxruntime", "rapidocr", "rapid-layout", "pillow", "pypdfium2"} <= set(libraries)
    assert "rapid-layout" not in engine_libraries(BASE.model_copy(update={"layout": "lines"}))
    minicpm = BASE.model_copy(update={"engines": ["rapidocr", "minicpm"]})
    assert {"torch", "transformers"} <= engine_libraries(minicpm)
    assert {"torch", "transformers"} <= scorer_libraries(BASE.model_copy(update={"scorer": "jev"}))


def test_a_checkpoint_is_known_by_its_content_not_by_its_path(tmp_path: Path) -> None:
    """Images that mount the same model at different paths make one run."""
    pytest.importorskip("transformers")
    from ocrfleet.engines import describe_engines

    def described(folder: Path) -> list[dict]:
        settings = BASE.model_copy(update={"engines": ["minicpm"], "minicpm_model_path": folder})
        return describe_engines(settings)["recognisers"]

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"model_type": "minicpm_ocr"}')
    assert described(tmp_path / "a") == described(tmp_path / "b")
    (tmp_path / "b" / "config.json").write_text('{"model_type": "minicpm_ocr", "layers": 2}')
    assert described(tmp_path / "a") != described(tmp_path / "b")


def test_an_install_without_torch_computes_the_same_run(tmp_path: Path) -> None:
    """The README's client-only install (base requirements, no models extra) and this one
    (with torch and transformers) agree on a CPU run."""
    try:
        python = client_venv.build(tmp_path / "venv")
    except client_venv.VenvUnavailable as exc:
        pytest.skip(f"no client-only venv can be built offline here: {exc}")
    code = (
        "import importlib.util, json\n"
        "from ocrfleet.config import Settings\n"
        "from ocrfleet.runs import run_config, run_id_of\n"
        "torch = importlib.util.find_spec('torch') is not None\n"
        "print(json.dumps([run_id_of(run_config(Settings(_env_file=None))), torch]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCRFLEET_")}
    done = subprocess.run(
        [str(python), "-c", code],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    there, has_torch = json.loads(done.stdout.strip().splitlines()[-1])
    assert has_torch is False
    assert there == base_run()


def run_id_command(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OCRFLEET_")}
    return subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", "run-id", *args],
        cwd=tmp_path,
        env={
            **environ,
            "OCRFLEET_DATABASE_URL": f"sqlite:///{tmp_path / 'o.db'}",
            "OCRFLEET_CACHE_DIR": str(tmp_path / "cache"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_run_id_prints_the_run_and_its_parts(tmp_path: Path) -> None:
    done = run_id_command(tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["run_id"] == run_id_of(printed["config"]) == base_run()
    assert printed["pinned"] is None
    assert printed["config"]["scorer"]["precheck"] == {"min_side_px": 4, "max_text_chars": 4096}

    as_text = run_id_command(tmp_path, OCRFLEET_DPI="150")
    assert as_text.returncode == 0, as_text.stderr
    first, *parts = as_text.stdout.splitlines()
    assert first == run_of(dpi=150)
    assert "  dpi: 150" in parts and "  engines.timeout_s: null" in parts


def test_run_id_registers_the_run_for_pinned_submitters(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    done = run_id_command(tmp_path, "--register", OCRFLEET_RUN_ID=base_run())
    assert done.returncode == 0, done.stderr
    engine = create_engine(f"sqlite:///{tmp_path / 'o.db'}")
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT id, config FROM runs")).all()
    engine.dispose()
    assert [run_id for run_id, _ in stored] == [base_run()]
    assert run_id_of(json.loads(stored[0][1])) == base_run()


def test_run_id_refuses_a_pin_it_does_not_match(tmp_path: Path) -> None:
    done = run_id_command(tmp_path, OCRFLEET_RUN_ID="f" * 64)
    assert done.returncode == 2
    assert "OCRFLEET_RUN_ID is ffff" in done.stderr and base_run() in done.stderr


def test_a_missing_model_is_a_configuration_error_that_names_the_pin(tmp_path: Path) -> None:
    done = run_id_command(tmp_path, OCRFLEET_ENGINES="rapidocr,minicpm")
    assert done.returncode == 2, done.stderr
    assert "OCRFLEET_MINICPM_MODEL_PATH is not set" in done.stderr
    assert "OCRFLEET_RUN_ID" in done.stderr and "Traceback" not in done.stderr


def test_the_scheduler_reports_a_run_no_live_worker_serves(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import time

    import redis

    from ocrfleet.scheduler.loop import Scheduler
    from ocrfleet.scheduler.signals import Snapshot, runs_waiting, worker_signals
    from ocrfleet.tasks.heartbeat import WAITING_KEY, ready_key, worker_key

    conn = redis.Redis.from_url(redis_url)
    now = time.time()
    conn.set(worker_key("gpu0@a"), json.dumps({"ts": now, "queues": ["gpu"], "held": []}))
    conn.set(ready_key("gpu0@a"), json.dumps({"load_s": 1.0, "run_id": "a" * 64}))
    conn.hset(WAITING_KEY, "b" * 64, json.dumps({"at": now - 5, "left_by": "a" * 64}))
    conn.hset(WAITING_KEY, "c" * 64, json.dumps({"at": now - 600, "left_by": "a" * 64}))

    def snapshot() -> Snapshot:
        return Snapshot(
            taken_at=now, queues={}, oldest_age_s={}, pending_pages={}, pages={},
            pages_total=0, pending_documents=0, pages_finished=0, documents_total=0,
            documents_split=0, workers=worker_signals(conn, now), runs_waiting=runs_waiting(conn),
        )  # fmt: skip

    # Work of run b waits and nobody runs b; run c's entry is stale (its waiting is over).
    assert snapshot().unserved_runs() == ["b" * 64]
    scheduler = Scheduler.__new__(Scheduler)
    scheduler._unserved = []
    with caplog.at_level(logging.WARNING, logger="ocrfleet.scheduler.loop"):
        scheduler._report_unserved(snapshot())
        scheduler._report_unserved(snapshot())  # said once, not every tick
    assert [r.getMessage()[:40] for r in caplog.records] == [
        f"run mismatch: work of run {'b' * 12} waits"[:40]
    ]
    assert "a" * 12 in caplog.records[0].getMessage()
    # A worker of run b comes up: nothing is unserved any more.
    conn.set(worker_key("gpu1@a"), json.dumps({"ts": now, "queues": ["gpu"], "held": []}))
    conn.set(ready_key("gpu1@a"), json.dumps({"load_s": 1.0, "run_id": "b" * 64}))
    assert snapshot().unserved_runs() == []
