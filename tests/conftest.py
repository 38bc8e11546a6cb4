"""Fixtures for real services: PostgreSQL on this machine; a redis-server of the test
session's own and moto's S3 server, each a subprocess on a free port of 127.0.0.1. Nothing
here patches a client in-process, and nothing touches the machine's Redis."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.corpus import REALDOCS  # noqa: F401  (tests import it from here)

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get(
    "OCRFLEET_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_DATABASES = 1024  # numbers the session's Redis hands out before it reuses one


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@contextmanager
def temporary_pg_database(prefix: str = "ocrfleet_t", template: str | None = None) -> Iterator[str]:
    """A fresh PostgreSQL database, empty or a copy of the database `template`, dropped
    (connections and all) afterwards."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy_of = f' TEMPLATE "{template}"' if template else ""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{copy_of}'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def database_copy(template: str, prefix: str) -> Iterator[str]:
    """A fresh copy of the PostgreSQL database `template` (a test's own copy of a world built
    once); this process's engines are disposed of before it is dropped."""
    from ocrfleet.db.session import dispose_engines

    with temporary_pg_database(prefix, template) as url:
        try:
            yield url
        finally:
            dispose_engines()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    with temporary_pg_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ocrfleet.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server as a real HTTP endpoint on 127.0.0.1."""
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3_bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the moto server; returns its name."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"ocrfleet-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(
        Bucket=name
    )
    return name


@dataclass
class RedisServer:
    """A redis-server of the test session's own (no persistence). Each user takes a
    database number of its own, flushed before it is handed out: tests never share keys."""

    url: str  # redis://127.0.0.1:PORT, no database
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    def database(self) -> str:
        import redis

        url = f"{self.url}/{next(self._numbers) % REDIS_DATABASES}"
        with redis.Redis.from_url(url) as conn:
            conn.flushdb()
        return url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """redis-server (scripts/services.sh installs it) on a free port, with a temporary
    directory and no persistence, killed when the session ends."""
    directory = tmp_path_factory.mktemp("redis")
    for _attempt in range(3):  # the free port can be taken before the server binds it
        port = free_port()
        with open(directory / "redis.log", "ab") as log:
            proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--dir", str(directory),
                    "--save", "",
                    "--appendonly", "no",
                    "--databases", str(REDIS_DATABASES),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_for_port(port, timeout=10)
        except TimeoutError:
            proc.kill()
            proc.wait(timeout=10)
            continue
        break
    else:
        log_tail = (directory / "redis.log").read_text()[-2000:]
        raise RuntimeError(f"redis-server did not start:\n{log_tail}")
    try:
        yield RedisServer(f"redis://127.0.0.1:{port}")
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """An empty Redis database of this test's own."""
    return redis_server.database()
