"""`ocrfleet api --workers 2`: whichever process answers a scrape reports the requests of
both (prometheus-client's multiprocess mode), so counters never jump between scrapes; the
review backlog, read from the database, appears once."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ocrfleet.db.migrate import upgrade
from tests.integration.fleet_helpers import api_process

pytestmark = pytest.mark.integration

HEALTHZ = {"method": "GET", "route": "/healthz", "status": "200"}


def _scrape(base: str) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def test_two_api_processes_report_one_sum(tmp_path: Path, redis_url: str) -> None:
    database = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(database)
    cache = tmp_path / "cache"
    env = {
        "OCRFLEET_DATABASE_URL": database,
        "OCRFLEET_BROKER_URL": redis_url,
        "OCRFLEET_STORE_URL": f"file://{tmp_path / 'store'}",
        "OCRFLEET_CACHE_DIR": str(cache),
    }
    with api_process(env, tmp_path / "api.log", args=["--workers", "2"]) as base:
        # New connections until both processes have served some (each writes its own
        # metric files, named by its pid), at most 400 requests.
        files = next(cache.glob("prometheus/api-*"))
        sent = 0
        while len({f.stem.rsplit("_", 1)[1] for f in files.glob("counter_*.db")}) < 2:
            assert sent < 400, "one API process served every request"
            assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200
            sent += 1
            time.sleep(0.01)

        for _ in range(6):  # scrapes land on either process: each reports both
            samples = _scrape(base)
            healthz = [
                v for n, labels, v in samples if n.endswith("requests_total") and labels == HEALTHZ
            ]
            assert healthz == [float(sent)]
            backlog = [s for s in samples if s[0] == "ocrfleet_review_oldest_open_flag_age_seconds"]
            assert backlog == [("ocrfleet_review_oldest_open_flag_age_seconds", {}, 0.0)]
