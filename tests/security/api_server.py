"""`ocrfleet api` as a real uvicorn process on a fresh PostgreSQL database, its own Redis
database and a moto S3 bucket, with an API key per tenant: what the API security tests
attack."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from ocrfleet.api.keys import add_key
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.session import dispose_engines, session_scope
from tests.conftest import temporary_pg_database
from tests.integration.fleet_helpers import api_process, fleet_env

TENANTS = ("acme", "globex")


@dataclass
class ApiServer:
    base: str
    env: dict[str, str]
    keys: dict[str, str]
    bucket: str
    log: Path

    def http(self, tenant: str | None = None, **kwargs: object) -> httpx.Client:
        """A client of the server, with `tenant`'s key (or none)."""
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"} if tenant else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]

    @property
    def database_url(self) -> str:
        return self.env["OCRFLEET_DATABASE_URL"]


@contextmanager
def running_api(
    moto_endpoint: str, broker_url: str, directory: Path, **extra: str
) -> Iterator[ApiServer]:
    """The server up and answering on the Redis database `broker_url`, `extra` added to its
    environment (keys are made in the fresh database whatever `OCRFLEET_DATABASE_URL`
    says); all it made is removed after."""
    import boto3

    bucket = f"ocrfleet-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    with temporary_pg_database() as pg_url:
        upgrade(pg_url)
        env = fleet_env(
            pg_url=pg_url,
            broker_url=broker_url,
            bucket=bucket,
            moto_endpoint=moto_endpoint,
            OCRFLEET_CACHE_DIR=str(directory / "cache"),
            **extra,
        )
        with session_scope(pg_url) as session:
            keys = {tenant: add_key(session, tenant)[1] for tenant in TENANTS}
        log = directory / "api.log"
        try:
            with api_process(env, log) as base:
                yield ApiServer(base, env, keys, bucket, log)
        finally:
            dispose_engines()
