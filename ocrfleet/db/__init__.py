"""The database of record (PostgreSQL in a fleet, SQLite embedded).

- models:  SQLAlchemy tables, each with a natural key
- session: get_engine(url), session_scope(url | settings), dispose_engines()
- upsert:  upsert(...) / upsert_many(...) on natural keys (INSERT .. ON CONFLICT)
- persist: save_page_result(...) / load_page_result(...)
- migrate: upgrade(url), downgrade(url, rev), check(url) over ocrfleet/migrations/

Import from those modules; this package imports nothing, so `import ocrfleet.db.session`
does not pull in Alembic.
"""
