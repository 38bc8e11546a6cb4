"""One pipeline run on real pixels for every review test: two bundled examples OCRed by
the real engines into a PostgreSQL template database (photo.jpg for tenant acme, memo.tif
for tenant globex), with three accounts. Each test gets its own copy of that database
(CREATE DATABASE … TEMPLATE), so reviews in one test never leak into another."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.review.users import add_user
from tests.conftest import database_copy, temporary_pg_database
from tests.integration.review.helpers import (
    ACCOUNTS,
    DOCUMENTS,
    FLAG_EVERYTHING,
    PASSWORD,
    World,
    run_examples,
)


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    store = tmp_path_factory.mktemp("review-store")
    with temporary_pg_database("ocrfleet_rt") as url:
        upgrade(url)
        settings = Settings(database_url=url, store_url=f"file://{store}", **FLAG_EVERYTHING)
        documents = run_examples(settings, DOCUMENTS)
        with session_scope(url) as session:
            for name, (role, tenant) in ACCOUNTS.items():
                add_user(session, name, PASSWORD, role, tenant)
        dispose_engines()  # a template database must have no connections
        yield World(
            template=url.rsplit("/", 1)[1], store_url=f"file://{store}", documents=documents
        )


@pytest.fixture
def review_db(world: World) -> Iterator[str]:
    """A fresh copy of the template database for one test."""
    with database_copy(world.template, "ocrfleet_rc") as url:
        yield url
