"""The review app in headless Chromium (Debian's `chromium`, driven by Playwright; never
`playwright install`): log in, open the queue, correct one region with the keyboard,
accept the others with the keyboard, see the document `reviewed`, and read the corrected
text back through `ocrfleet results`. The region view's screenshot is kept as an artifact
(the test's tmp folder and bench/out/review-region-view.png)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, wait_for_port
from tests.integration.review.helpers import PASSWORD, SECRET, World, ocrfleet_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CORRECTION = "Corrected In Chromium 7"


@pytest.fixture
def server(review_db: str, world: World) -> str:
    port = free_port()
    env = {
        **os.environ,
        "OCRFLEET_DATABASE_URL": review_db,
        "OCRFLEET_STORE_URL": world.store_url,
        "OCRFLEET_REVIEW_SECRET": SECRET,
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "ocrfleet.cli", "review", "--port", str(port)],
        env=env,
        cwd=REPO,
    )
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_review_a_document_in_chromium(
    server: str, review_db: str, world: World, tmp_path: Path
) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
    from playwright.sync_api import expect, sync_playwright

    document_id = world.documents["photo.jpg"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(20_000)
            page.goto(f"{server}/queue?document={document_id}")
            assert "/login" in page.url
            page.fill("input[name=name]", "alice")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url("**/queue**")
            page.goto(f"{server}/queue?document={document_id}")
            expect(page.locator("#flags")).to_be_visible()
            page.click("#start")
            page.wait_for_url("**/regions/**")
            expect(page.locator("#crop")).to_be_visible()
            page.wait_for_function("document.getElementById('page').complete")
            shot = tmp_path / "region-view.png"
            page.screenshot(path=str(shot), full_page=True)
            artifacts = REPO / "bench" / "out"
            artifacts.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, artifacts / "review-region-view.png")
            assert shot.stat().st_size > 10_000

            corrected_url = page.url
            page.keyboard.press("c")
            page.keyboard.press("Control+A")
            page.keyboard.type(CORRECTION)
            page.keyboard.press("Enter")
            page.wait_for_url(lambda url: url != corrected_url)
            accepted = 0
            while "/regions/" in page.url:  # accept every other flag with key 1
                current = page.url
                expect(page.locator("button[data-key='1']")).to_be_visible()
                page.keyboard.press("1")
                page.wait_for_url(lambda url, before=current: url != before)
                accepted += 1
            assert accepted >= 1
            expect(page.locator("#finished")).to_be_visible()

            page.goto(f"{server}/documents/{document_id}")
            expect(page.locator("#status")).to_have_text("reviewed")
            expect(page.locator("#final-text")).to_contain_text(CORRECTION)
        finally:
            browser.close()

    results = ocrfleet_cli(["results", str(document_id)], review_db, world)
    assert results.returncode == 0, results.stderr
    assert CORRECTION in results.stdout.splitlines()
