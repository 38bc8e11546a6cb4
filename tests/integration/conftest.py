"""Fixtures shared by the fleet's integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ocrfleet.db.migrate import upgrade
from ocrfleet.db.session import dispose_engines
from tests.integration.fleet_helpers import Workers, fleet_env


@pytest.fixture
def env(
    pg_url: str, redis_url: str, s3_bucket: str, moto_endpoint: str
) -> Iterator[dict[str, str]]:
    """OCRFLEET_* variables for workers and clients on a migrated PostgreSQL, Redis and S3."""
    upgrade(pg_url)
    yield fleet_env(
        pg_url=pg_url, broker_url=redis_url, bucket=s3_bucket, moto_endpoint=moto_endpoint
    )
    dispose_engines()  # let the pg_url fixture drop the database


@pytest.fixture
def started() -> Iterator[list[Workers]]:
    """Worker launchers a test starts (append them): stopped when it ends, pass or fail."""
    launched: list[Workers] = []
    yield launched
    for workers in launched:
        workers.stop()
