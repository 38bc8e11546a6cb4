"""Alembic environment for ocrfleet, on PostgreSQL and SQLite.

The URL is, first found: `-x url=...`, the config's `sqlalchemy.url` (set in code by
ocrfleet.db.migrate), `ocrfleet.config.get_settings().database_url`.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import Engine, create_engine, event, inspect, pool, text
from sqlalchemy.engine import Connection

from ocrfleet.db.models import Base
from ocrfleet.db.session import normalize_url

config = context.config

if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        from ocrfleet.config import get_settings

        url = get_settings().database_url
    return normalize_url(url)


def _options(dialect_name: str, views: set[str]) -> dict[str, Any]:
    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        # Views are created and dropped by hand in the revisions; autogenerate must not
        # see them as tables to drop (nor their columns and indexes as drift).
        if type_ == "table" and name in views:
            return False
        table = getattr(obj, "table", None)
        return not (table is not None and table.name in views)

    return {
        "target_metadata": target_metadata,
        "compare_type": True,
        "render_as_batch": dialect_name == "sqlite",
        "include_object": include_object,
    }


def run_migrations_offline() -> None:
    url = database_url()
    dialect_name = url.split(":", 1)[0].split("+", 1)[0]
    context.configure(
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **_options(dialect_name, set()),
    )
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    dialect_name = connection.dialect.name
    if dialect_name == "postgresql":
        # A migration waiting on a lock must not queue every query behind it; give up
        # and retry the deploy instead. Session-level SETs survive this commit.
        connection.execute(text("SET lock_timeout = '5s'"))
        connection.execute(text("SET statement_timeout = '60s'"))
        connection.commit()
    views = set(inspect(connection).get_view_names())
    connection.commit()
    context.configure(connection=connection, **_options(dialect_name, views))
    with context.begin_transaction():
        context.run_migrations()
    if dialect_name == "sqlite":
        # Migrations run with foreign keys off (SQLite's default), so batch table rebuilds
        # cannot cascade deletes; check what they left behind instead.
        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"foreign key violations after migrating: {broken[:10]}")


def _transactional_sqlite_ddl(engine: Engine) -> None:
    """sqlite3's legacy mode autocommits each DDL statement; emit BEGIN ourselves so a
    failed migration rolls back whole."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN")


def run_migrations_online() -> None:
    engine = create_engine(database_url(), poolclass=pool.NullPool)
    if engine.dialect.name == "sqlite":
        _transactional_sqlite_ddl(engine)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
