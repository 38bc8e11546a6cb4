"""Writes keyed on natural keys, so a redelivered task lands on the rows it made before.

Both helpers compile to `INSERT .. ON CONFLICT (key) DO UPDATE | DO NOTHING`, which
PostgreSQL and SQLite (>= 3.35) resolve atomically: two sessions racing on one key end
with one row (on PostgreSQL the second waits for the first to commit, on SQLite the write
lock serialises them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Column, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ocrfleet.db.models import Base

_INSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def _check_columns(table: Table, names: Iterable[str], what: str) -> None:
    unknown = [name for name in names if name not in table.c]
    if unknown:
        raise ValueError(f"{table.name} has no column(s) {unknown} ({what})")


def _update_columns(
    table: Table, columns: Sequence[str], key: Sequence[str], update: Sequence[str] | None
) -> list[str]:
    if update is None:
        return [name for name in columns if name not in key]
    _check_columns(table, update, "update")
    overlap = set(update) & set(key)
    if overlap:
        raise ValueError(f"cannot update key column(s) {sorted(overlap)} of {table.name}")
    missing = [name for name in update if name not in columns]
    if missing:
        raise ValueError(f"update column(s) {missing} of {table.name} have no value")
    return list(update)


def _onupdate_value(column: Column[Any]) -> Any:
    default = column.onupdate
    if default.is_callable:  # type: ignore[union-attr]
        return default.arg(None)  # type: ignore[union-attr,operator]
    return default.arg  # type: ignore[union-attr]


def _statement(
    session: Session,
    table: Table,
    columns: Sequence[str],
    key: Sequence[str],
    update: Sequence[str] | None,
) -> Any:
    dialect = session.get_bind().dialect.name
    insert = _INSERTS.get(dialect)
    if insert is None:
        raise NotImplementedError(f"upsert supports {sorted(_INSERTS)}, not {dialect}")
    if not key:
        raise ValueError(f"upsert into {table.name} needs a key")
    _check_columns(table, columns, "values")
    _check_columns(table, key, "key")
    absent = [name for name in key if name not in columns]
    if absent:
        raise ValueError(f"key column(s) {absent} of {table.name} have no value")
    to_update = _update_columns(table, columns, key, update)
    stmt = insert(table)
    if not to_update:
        return stmt.on_conflict_do_nothing(index_elements=list(key))
    set_: dict[str, Any] = {name: stmt.excluded[name] for name in to_update}
    # ON CONFLICT DO UPDATE skips Column.onupdate (e.g. updated_at); apply it here.
    for column in table.columns:
        if column.onupdate is not None and column.name not in set_ and column.name not in key:
            set_[column.name] = _onupdate_value(column)
    return stmt.on_conflict_do_update(index_elements=list(key), set_=set_)


def _primary_key(table: Table) -> Column[Any]:
    columns = list(table.primary_key.columns)
    if len(columns) != 1:
        raise ValueError(f"upsert needs a single-column primary key, {table.name} has {columns}")
    return columns[0]


def upsert(
    session: Session,
    model: type[Base],
    values: dict[str, Any],
    key: Sequence[str],
    update: list[str] | None = None,
) -> Any:
    """Insert `values` or, if a row with the same `key` exists, update it; returns its
    primary key (an int id for every table but `runs`, whose id is the run hash).

    `update=None` updates every non-key column given in `values`; `update=[]` leaves an
    existing row untouched (DO NOTHING).
    """
    table: Table = model.__table__  # type: ignore[assignment]
    pk = _primary_key(table)
    stmt = _statement(session, table, list(values), key, update).values(values)
    row_id = session.execute(stmt.returning(pk)).scalar_one_or_none()
    if row_id is not None:
        return row_id
    # DO NOTHING returns no row for a conflict. The conflicting row is committed by now
    # (PostgreSQL waited for it), so a fresh read in READ COMMITTED sees it.
    where = [table.c[name] == values[name] for name in key]
    return session.execute(select(pk).where(*where)).scalar_one()


def upsert_many(
    session: Session,
    model: type[Base],
    rows: Sequence[dict[str, Any]],
    key: Sequence[str],
    update: list[str] | None = None,
) -> None:
    """`upsert` for many rows in one executemany; rows share their columns and each key
    appears once. Rows are written in order, so new rows get ascending ids in that order.
    """
    if not rows:
        return
    columns = list(rows[0])
    seen: set[tuple[Any, ...]] = set()
    for row in rows:
        if set(row) != set(columns):
            raise ValueError(f"rows for {model.__tablename__} differ in columns: {sorted(row)}")
        natural = tuple(row.get(name) for name in key)
        if natural in seen:
            raise ValueError(f"key {dict(zip(key, natural, strict=True))} repeats in rows")
        seen.add(natural)
    table: Table = model.__table__  # type: ignore[assignment]
    session.execute(_statement(session, table, columns, key, update), list(rows))
