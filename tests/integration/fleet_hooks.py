"""Test-only worker hooks: SIGKILL the worker process in the middle of chosen pages.

Loaded into the workers by the tests with `ocrfleet worker --include
tests.integration.fleet_hooks`; production code has no hook of its own: this module
connects to ocrfleet's public `page_started` signal and to SQLAlchemy's engine events.

Marker files in $FLEET_KILL_DIR name pages as `<document sha256>-<page number>`:
- `once-<sha>-<n>`: the first delivery dies in the middle of the page's transaction (at
  its first candidate INSERT: regions written, nothing committed); the file is consumed.
- `always-<sha>-<n>`: every delivery dies as soon as it has started.
- `slow-<sha>-<n>`: every delivery sleeps at its first candidate INSERT until the soft time
  limit interrupts it.
- `stubborn-<sha>-<n>`: every delivery sleeps as soon as it has started (a page read on a
  loaded machine can outlast a short soft limit by itself) and ignores the soft limit, so
  the hard limit kills it.
- `crash-<sha>-<n>`: the first delivery SIGKILLs the worker's *main* process (as an OOM
  kill or a host crash does) and then its own pool process, in the middle of the page's
  transaction; the file is consumed.
Each kill appends the dying pid to `killed-<kind>-<sha>-<n>`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from ocrfleet.tasks.lifecycle import context, page_started

_armed: dict[str, str] = {}


def _kill_dir() -> Path | None:
    value = os.environ.get("FLEET_KILL_DIR")
    return Path(value) if value else None


def _page_key(page_id: int) -> str:
    with context().session() as session:
        sha256, number = session.execute(
            text(
                "SELECT d.sha256, p.number FROM pages p "
                "JOIN documents d ON d.id = p.document_id WHERE p.id = :id"
            ),
            {"id": page_id},
        ).one()
    return f"{sha256}-{number}"


def _die(kill_dir: Path, kind: str, key: str) -> None:
    with open(kill_dir / f"killed-{kind}-{key}", "a") as record:
        record.write(f"{os.getpid()}\n")
        record.flush()
        os.fsync(record.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def _sleep_through_soft_limits() -> None:
    while True:
        try:
            time.sleep(3600)
        except SoftTimeLimitExceeded:
            continue  # only the hard time limit (SIGKILL from the pool) stops this


def _on_page_started(sender: Any = None, page_id: int | None = None, **_: Any) -> None:
    _armed.clear()
    kill_dir = _kill_dir()
    if kill_dir is None or page_id is None:
        return
    key = _page_key(page_id)
    if (kill_dir / f"always-{key}").exists():
        _die(kill_dir, "always", key)
    if (kill_dir / f"stubborn-{key}").exists():
        _sleep_through_soft_limits()
    for kind in ("once", "slow", "crash"):
        if (kill_dir / f"{kind}-{key}").exists():
            _armed["key"], _armed["kind"] = key, kind


def _before_cursor_execute(
    conn: Any, cursor: Any, statement: str, *args: Any, **kwargs: Any
) -> None:
    key = _armed.get("key")
    kill_dir = _kill_dir()
    if key is None or kill_dir is None:
        return
    if not statement.lstrip().upper().startswith("INSERT INTO CANDIDATES"):
        return
    if _armed.get("kind") == "slow":
        time.sleep(3600)  # the soft time limit raises in here
    kind = _armed.get("kind", "once")
    try:
        os.unlink(kill_dir / f"{kind}-{key}")  # atomic claim: exactly one process wins it
    except FileNotFoundError:
        _armed.clear()
        return
    if kind == "crash":
        with open(kill_dir / f"killed-crash-{key}", "a") as record:
            record.write(f"{os.getppid()}\n")
        os.kill(os.getppid(), signal.SIGKILL)
    _die(kill_dir, kind, key)


def _on_task_postrun(**_: Any) -> None:
    _armed.clear()


page_started.connect(_on_page_started, weak=False, dispatch_uid="fleet_hooks.page_started")
task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="fleet_hooks.task_postrun")
event.listen(Engine, "before_cursor_execute", _before_cursor_execute)
