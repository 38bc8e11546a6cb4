"""Shared pieces of the review tests: the accounts, the example documents, the settings
and the CLI runner. Fixtures are in conftest.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

from starlette.testclient import TestClient

from ocrfleet.config import Settings
from ocrfleet.service import Context, ingest, process_page
from tests.conftest import REPO

EXAMPLES = REPO / "examples"
SECRET = "review-tests-" + "s" * 32
PASSWORD = "correct horse battery"
# name -> (role, tenant); "*" is every tenant
ACCOUNTS = {"alice": ("reviewer", "acme"), "bob": ("reviewer", "globex"), "root": ("admin", "*")}
DOCUMENTS = {"photo.jpg": "acme", "memo.tif": "globex"}
# The review tests need open flags on both documents and on both of memo.tif's pages,
# whatever the shipped calibration accepts: a threshold no score reaches routes every
# scored region to review.
FLAG_EVERYTHING = {f"threshold_{c}": 1.0 for c in ("text", "formula", "table")}


@dataclass(frozen=True)
class World:
    template: str  # database name of the template
    store_url: str
    documents: dict[str, int]  # example name -> document id


def settings_for(url: str, world: World, **extra: object) -> Settings:
    return Settings(
        database_url=url,
        store_url=world.store_url,
        review_secret=SECRET,
        **extra,  # type: ignore[arg-type]
    )


def run_examples(settings: Settings, documents: dict[str, str]) -> dict[str, int]:
    """The real pipeline, as `ocrfleet run` drives it, with tenant metadata."""
    ctx = Context(settings)
    ids = {}
    for name, tenant in documents.items():
        outcome = ingest(ctx, str(EXAMPLES / name), metadata={"tenant": tenant})
        for page_id in outcome.page_ids:
            process_page(ctx, page_id)
        ids[name] = outcome.document_id
    return ids


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def version_of(html: str) -> str:
    found = re.search(r'name="version" value="(\d+)"', html)
    assert found, "no version field in the page"
    return found.group(1)


def login(client: TestClient, name: str, password: str = PASSWORD) -> None:
    token = csrf_of(client.get("/login").text)
    response = client.post(
        "/login",
        data={"csrf": token, "name": name, "password": password, "next": "/queue"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text


def ocrfleet_cli(
    args: list[str], url: str, world: World, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OCRFLEET_DATABASE_URL": url,
        "OCRFLEET_STORE_URL": world.store_url,
        "OCRFLEET_REVIEW_SECRET": SECRET,
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "ocrfleet.cli", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )

