"""Engines and THE session scope. Every database write in ocrfleet goes through
`session_scope`, so a task's work commits together or not at all."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from ocrfleet.config import Settings

SQLITE_BUSY_TIMEOUT_MS = 30_000

_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_sessionmakers: dict[str, sessionmaker[Session]] = {}
_owner_pid = os.getpid()


def normalize_url(url: str) -> str:
    """Pin PostgreSQL to psycopg 3, whatever spelling the deployment used."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy emit BEGIN itself (see _on_begin); the pragmas below must run
        # outside a transaction anyway.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # IMMEDIATE takes the write lock up front, so a transaction that read first and
        # writes later waits on busy_timeout instead of failing with "database is locked"
        # when another writer committed in between (WAL cannot upgrade a stale snapshot).
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _build_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url)
        _configure_sqlite(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True, connect_args={"application_name": "ocrfleet"})
    raise ValueError(f"unsupported database URL {parsed!r}: use sqlite:/// or postgresql://")


def _forget_inherited_engines() -> None:
    """A forked child must not touch the parent's pooled sockets or file handles."""
    global _owner_pid
    if _owner_pid == os.getpid():
        return
    for engine in _engines.values():
        engine.dispose(close=False)
    _engines.clear()
    _sessionmakers.clear()
    _owner_pid = os.getpid()


def get_engine(url: str) -> Engine:
    """The process's engine for `url`, created on first use."""
    url = normalize_url(url)
    with _lock:
        _forget_inherited_engines()
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = _build_engine(url)
        return engine


def _sessionmaker(url: str) -> sessionmaker[Session]:
    engine = get_engine(url)
    key = normalize_url(url)
    with _lock:
        factory = _sessionmakers.get(key)
        if factory is None:
            # expire_on_commit=False: rows returned from a scope stay readable after it.
            factory = _sessionmakers[key] = sessionmaker(engine, expire_on_commit=False)
        return factory


@contextmanager
def session_scope(url_or_settings: str | Settings | None = None) -> Iterator[Session]:
    """One unit of work: commits when the block ends, rolls back if it raises.

    `url_or_settings` is a database URL or a Settings; None means `get_settings()`.
    """
    if url_or_settings is None:
        from ocrfleet.config import get_settings

        url_or_settings = get_settings()
    url = url_or_settings if isinstance(url_or_settings, str) else url_or_settings.database_url
    session = _sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def dispose_engines() -> None:
    """Close every cached engine's connections and forget them (tests, shutdown)."""
    with _lock:
        _forget_inherited_engines()
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _sessionmakers.clear()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at fork time
    _forget_inherited_engines()


os.register_at_fork(after_in_child=_after_fork_in_child)
