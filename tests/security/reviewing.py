"""The review app as the security tests meet it: the real pipeline's output for two
tenants in a PostgreSQL template (built once per session, shared by every review test
file), a fresh copy of it per test, and `ocrfleet review` served by uvicorn in its own
process, reached over HTTP with httpx. Test files import the fixtures `world` and
`review_db` from here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.models import Page, Region, ReviewFlag
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.review.users import add_user
from tests.conftest import REPO, database_copy, free_port, temporary_pg_database, wait_for_port
from tests.integration.review.helpers import (
    ACCOUNTS,
    DOCUMENTS,
    FLAG_EVERYTHING,
    PASSWORD,
    SECRET,
    World,
    csrf_of,
    run_examples,
)

_shared: dict[str, World] = {}
AUTOMATIC = "memo.tif (accepted automatically)"  # a key of World.documents, tenant globex


def shared_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> World:
    """The template world, built on first use and dropped when the session ends."""
    if "world" not in _shared:
        stack = ExitStack()
        request.config.add_cleanup(stack.close)
        store = tmp_path_factory.mktemp("review-security-store")
        url = stack.enter_context(temporary_pg_database("ocrfleet_rs"))
        upgrade(url)
        settings = Settings(database_url=url, store_url=f"file://{store}", **FLAG_EVERYTHING)
        documents = run_examples(settings, DOCUMENTS)
        # The same memo under thresholds of 0: a run whose scored regions are accepted
        # automatically, for the overrides only an admin may make.
        everything = {f"threshold_{c}": 0.0 for c in ("text", "formula", "table")}
        accepted = run_examples(settings.model_copy(update=everything), {"memo.tif": "globex"})
        documents[AUTOMATIC] = accepted["memo.tif"]
        with session_scope(url) as session:
            for name, (role, tenant) in ACCOUNTS.items():
                add_user(session, name, PASSWORD, role, tenant)
        dispose_engines()  # a template database must have no connections
        _shared["world"] = World(url.rsplit("/", 1)[1], f"file://{store}", documents)
    return _shared["world"]


@pytest.fixture(scope="session")
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> World:
    return shared_world(request, tmp_path_factory)


@pytest.fixture
def review_db(world: World) -> Iterator[str]:
    """A fresh copy of the template database for one test."""
    with database_copy(world.template, "ocrfleet_rsc") as url:
        yield url


def environment(url: str, world: World, **settings: object) -> dict[str, str]:
    """The environment of an ocrfleet process over this database and store."""
    extra = {f"OCRFLEET_{key.upper()}": str(value) for key, value in settings.items()}
    return {
        **os.environ,
        "OCRFLEET_DATABASE_URL": url,
        "OCRFLEET_STORE_URL": world.store_url,
        "OCRFLEET_REVIEW_SECRET": SECRET,
        "PYTHONPATH": str(REPO),
        **extra,
    }


@dataclass(frozen=True)
class Server:
    url: str
    pid: int

    def peak_rss_mb(self) -> float:
        """The process's peak resident memory so far (VmHWM)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        found = re.search(r"VmHWM:\s+(\d+) kB", status)
        assert found
        return int(found.group(1)) / 1024


@contextmanager
def serve(url: str, world: World, **settings: object) -> Iterator[Server]:
    """`ocrfleet review` in its own process on a free port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ocrfleet.cli", "review", "--port", str(port)],
        env=environment(url, world, **settings),
        cwd=REPO,
    )
    try:
        wait_for_port(port, timeout=60)
        yield Server(f"http://127.0.0.1:{port}", proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def ocrfleet(
    args: list[str], url: str, world: World, stdin: str | None = None, **settings: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", *args],
        env=environment(url, world, **settings),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def client(server: Server, **headers: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=headers, timeout=60, follow_redirects=False)


def login(http: httpx.Client, name: str, password: str = PASSWORD) -> httpx.Response:
    token = csrf_of(http.get("/login").text)
    return http.post("/login", data={"csrf": token, "name": name, "password": password})


def logged_in(server: Server, name: str, **headers: str) -> httpx.Client:
    http = client(server, **headers)
    response = login(http, name)
    assert response.status_code == 303, response.text
    return http


def regions_of(url: str, document_id: int, *, flagged: bool) -> list[int]:
    """The document's regions with (or without) a review flag, in id order."""
    has_flag = select(ReviewFlag.id).where(ReviewFlag.region_id == Region.id).exists()
    with session_scope(url) as session:
        return list(
            session.scalars(
                select(Region.id)
                .join(Page, Page.id == Region.page_id)
                .where(Page.document_id == document_id, has_flag if flagged else ~has_flag)
                .order_by(Region.id)
            ).all()
        )
