"""Server time of the review loop over 1,000 open flags in PostgreSQL: the queue page, the
claim of the next region, the region view, and the correction that closes its flag.

The flags are real: the bundled examples go through the real pipeline once, and their
documents (pages, regions, candidates, scores, flags) are replicated in SQL under new
sha256s until at least `--flags` flags are open. One reviewer then works `--reviews` of
them through the real app (Starlette, in process); every request is timed inside the ASGI
call, so the number is the server's, not the client's. Baseline in the same run: the login
page (a template render with no database query).

    python bench/review_latency.py [--flags 1000] [--reviews 200]

The last lines read `baseline p95 ms: X`, `ratio p95/baseline: X.X` and `review p95 ms: X`
(target: under 100 ms on this machine).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from sqlalchemy import text  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.db.migrate import upgrade  # noqa: E402
from ocrfleet.db.session import dispose_engines, session_scope  # noqa: E402
from ocrfleet.review.app import create_app  # noqa: E402
from ocrfleet.review.users import add_user  # noqa: E402
from ocrfleet.service import Context, ingest, process_page  # noqa: E402
from tests.conftest import temporary_pg_database  # noqa: E402

EXAMPLES = REPO / "examples"
PASSWORD = "bench password"
# Child tables in dependency order, with the columns copied (ids are offset per copy).
COPIES = {
    "pages": "document_id, number, width, height, image_uri, status, deliveries, reason, "
    "params, output_sha256, updated_at",
    "regions": "page_id, number, category, x0, y0, x1, y1, det_score, chosen_engine, accepted",
    "candidates": "region_id, engine, text, confidence, error, truncated, read_as, skipped, words",
    "scores": "candidate_id, scorer, scorer_version, verdict, score, error",
    "review_flags": "region_id, reason, status, resolved_text, created_at, detail",
}
PARENT = {
    "pages": "document_id",
    "regions": "page_id",
    "candidates": "region_id",
    "scores": "candidate_id",
    "review_flags": "region_id",
}


class Timed:
    """ASGI wrapper that records (path, seconds) of every request it serves."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.times: list[tuple[str, str, float]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        await self.app(scope, receive, send)
        if scope["type"] == "http":
            self.times.append((scope["method"], scope["path"], time.perf_counter() - started))


def replicate(url: str, flags: int) -> int:
    """Copy the processed documents under new sha256s until `flags` flags are open."""
    with session_scope(url) as session:
        have = session.execute(text("SELECT count(*) FROM review_flags")).scalar_one()
        if have == 0:
            raise SystemExit("the examples raised no flags: nothing to replicate")
        tables = ["documents", *COPIES]
        stride = 1 + max(
            session.execute(text(f"SELECT coalesce(max(id), 0) FROM {t}")).scalar_one()
            for t in tables
        )
        copies = -(-flags // have) - 1
        for copy in range(1, copies + 1):
            offset = copy * stride
            session.execute(
                text(
                    "INSERT INTO documents (id, run_id, sha256, source_uri, media_type, "
                    "byte_size, page_count, pages_done, pages_failed, status, reason, priority, "
                    "meta, tenant, created_at, updated_at) "
                    "SELECT id + :off, run_id, substr(sha256, 1, 56) || lpad(:copy, 8, '0'), "
                    "source_uri, media_type, byte_size, page_count, pages_done, pages_failed, "
                    "status, reason, priority, meta, tenant, created_at, updated_at "
                    "FROM documents WHERE id < :stride"
                ),
                {"off": offset, "copy": str(copy), "stride": stride},
            )
            for table, columns in COPIES.items():
                parent = PARENT[table]
                select_columns = columns.replace(parent, f"{parent} + :off", 1)
                session.execute(
                    text(
                        f"INSERT INTO {table} (id, {columns}) "
                        f"SELECT id + :off, {select_columns} FROM {table} WHERE id < :stride"
                    ),
                    {"off": offset, "stride": stride},
                )
        for table in tables:
            session.execute(
                text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                     f"(SELECT max(id) FROM {table}))")
            )  # fmt: skip
        return session.execute(
            text("SELECT count(*) FROM review_flags WHERE status = 'open'")
        ).scalar_one()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values) * 1000.0, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flags", type=int, default=1000, help="open flags in the database")
    parser.add_argument("--reviews", type=int, default=200, help="flags worked through the app")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as store, temporary_pg_database("ocrfleet_bench") as url:
        upgrade(url)
        settings = Settings(
            database_url=url, store_url=f"file://{store}", review_secret="b" * 40
        )
        ctx = Context(settings)
        for path in sorted(p for p in EXAMPLES.iterdir() if p.suffix in {".pdf", ".tif",
                                                                           ".png", ".jpg"}):
            for page_id in ingest(ctx, str(path)).page_ids:
                process_page(ctx, page_id)
        open_flags = replicate(url, args.flags)
        with session_scope(url) as session:
            add_user(session, "bench", PASSWORD, "reviewer")
        print(f"open flags in PostgreSQL: {open_flags}")

        timed = Timed(create_app(settings))
        client = TestClient(timed)
        for _ in range(20):
            client.get("/login")
        token = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text).group(1)
        client.post("/login", data={"csrf": token, "name": "bench", "password": PASSWORD})
        baseline = [seconds for method, path, seconds in timed.times if path == "/login"]
        timed.times.clear()

        reviews = min(args.reviews, open_flags)
        for index in range(reviews):
            queue = client.get("/queue")
            token = re.search(r'name="csrf" value="([^"]+)"', queue.text).group(1)
            moved = client.post("/next", data={"csrf": token}, follow_redirects=False)
            region = moved.headers["location"].split("?")[0]
            page = client.get(region)
            version = re.search(r'name="version" value="(\d+)"', page.text).group(1)
            form = {"csrf": token, "version": version, "action": "correct"}
            done = client.post(
                f"{region}/review",
                data={**form, "text": f"corrected {index}"},
                follow_redirects=False,
            )
            assert done.status_code == 303, done.text
        dispose_engines()

    kinds: dict[str, list[float]] = {}
    for _, path, seconds in timed.times:
        kind = "correction" if path.endswith("/review") else re.sub(r"\d+", "N", path)
        kinds.setdefault(kind, []).append(seconds)
    everything = [seconds for _, _, seconds in timed.times]
    for kind, values in kinds.items():
        print(
            f"{kind:>14}: n={len(values)} p50 {percentile(values, 50):.1f} ms, "
            f"p95 {percentile(values, 95):.1f} ms"
        )
    base = percentile(baseline, 95)
    print(f"baseline p95 ms: {base:.1f}")
    print(f"ratio p95/baseline: {percentile(everything, 95) / base:.1f}")
    print(f"review p95 ms: {percentile(everything, 95):.1f}")


if __name__ == "__main__":
    main()
