"""Finding 7: roles and tenant scope are enforced. A reviewer without a tenant sees no
tenant's documents unless made global; only an admin overrides an automatic acceptance or
another reviewer's decision; a decision made against a stale version is refused with the
decision that came first, and an admin's override keeps both in the history."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import select

from ocrfleet.db.models import Review
from ocrfleet.db.session import session_scope
from ocrfleet.review.users import GLOBAL, add_user
from tests.integration.review.helpers import PASSWORD, World, csrf_of, version_of
from tests.security import reviewing
from tests.security.reviewing import (
    AUTOMATIC,
    logged_in,
    regions_of,
    serve,
)

world, review_db = reviewing.world, reviewing.review_db  # the fixtures
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def reviews(url: str, region_id: int) -> list[tuple[int, str, str, int | None]]:
    with session_scope(url) as session:
        return [
            tuple(row)
            for row in session.execute(
                select(Review.id, Review.action, Review.final_text, Review.overrides_id)
                .where(Review.region_id == region_id)
                .order_by(Review.id)
            ).all()
        ]


def decide(http: httpx.Client, region_id: int, **form: str) -> httpx.Response:
    page = http.get(f"/regions/{region_id}")
    assert page.status_code == 200
    data = {"csrf": csrf_of(page.text), "version": version_of(page.text), **form}
    return http.post(f"/regions/{region_id}/review", data=data)


@pytest.mark.finding(
    7,
    before="a reviewer with no tenant saw every tenant",
    after="it sees only documents without a tenant; `--global` (tenant '*') sees all",
)
def test_a_tenantless_reviewer_sees_no_tenant(review_db: str, world: World) -> None:
    with session_scope(review_db) as session:
        add_user(session, "nobody", PASSWORD, "reviewer")
        add_user(session, "everyone", PASSWORD, "reviewer", GLOBAL)
    acme = world.documents["photo.jpg"]
    region = regions_of(review_db, acme, flagged=True)[0]
    with serve(review_db, world) as server:
        nobody = logged_in(server, "nobody")
        queue = nobody.get("/queue").text
        assert not re.findall(r'href="/regions/\d+', queue)
        for path in (f"/regions/{region}", f"/documents/{acme}", f"/regions/{region}/crop.png"):
            assert nobody.get(path).status_code == 404, path
        everyone = logged_in(server, "everyone")
        assert everyone.get(f"/regions/{region}").status_code == 200
        assert f'href="/regions/{region}?' in everyone.get("/queue").text


@pytest.mark.finding(
    7,
    before="any reviewer overwrote an auto-accepted region or another's decision, last wins",
    after="403 for a reviewer; a stale version gets 409 with the other decision shown",
)
def test_only_an_admin_overrides_and_history_keeps_both(review_db: str, world: World) -> None:
    with session_scope(review_db) as session:
        add_user(session, "carol", PASSWORD, "reviewer", "acme")
    acme = world.documents["photo.jpg"]
    automatic = regions_of(review_db, world.documents[AUTOMATIC], flagged=False)[0]
    flagged = regions_of(review_db, acme, flagged=True)[0]
    with serve(review_db, world) as server:
        alice, carol = logged_in(server, "alice"), logged_in(server, "carol")
        bob, root = logged_in(server, "bob"), logged_in(server, "root")
        # Carol opens the flagged region, then alice decides it first.
        seen = carol.get(f"/regions/{flagged}").text
        assert decide(alice, flagged, action="correct", text="Alice Reads 7").status_code == 303
        late = carol.post(
            f"/regions/{flagged}/review",
            data={"csrf": csrf_of(seen), "version": version_of(seen), "action": "unreadable"},
        )
        assert late.status_code == 409
        conflict = re.search(r'<div class="conflict" id="conflict">(.*?)</div>', late.text, re.S)
        assert conflict and "alice" in conflict.group(1) and "Alice Reads 7" in conflict.group(1)
        # With the current version she is still only a reviewer: no override.
        assert decide(carol, flagged, action="unreadable").status_code == 403
        (first,) = reviews(review_db, flagged)

        # An admin's override names what it replaced; the page shows both.
        assert decide(root, flagged, action="correct", text="Root Reads 8").status_code == 303
        kept, override = reviews(review_db, flagged)
        assert kept == first and override[1:] == ("correct", "Root Reads 8", first[0])
        history = root.get(f"/regions/{flagged}").text
        assert "Alice Reads 7" in history and "Root Reads 8" in history
        assert f"overrides #{first[0]}" in history

        # An automatic acceptance: a reviewer (of its tenant) may not override it, an
        # admin may.
        refused = decide(bob, automatic, action="correct", text="bob was here")
        assert refused.status_code == 403 and "admin" in refused.text
        assert reviews(review_db, automatic) == []
        assert decide(root, automatic, action="correct", text="root fixed it").status_code == 303
        (override,) = reviews(review_db, automatic)
        assert override[1:] == ("correct", "root fixed it", None)


@pytest.mark.finding(7)
def test_two_decisions_at_once_one_wins_one_conflicts(review_db: str, world: World) -> None:
    with session_scope(review_db) as session:
        add_user(session, "carol", PASSWORD, "reviewer", "acme")
    flagged = regions_of(review_db, world.documents["photo.jpg"], flagged=True)[1]
    with serve(review_db, world) as server:
        clients = [logged_in(server, "alice"), logged_in(server, "carol")]
        pages = [c.get(f"/regions/{flagged}").text for c in clients]

        def post(i: int) -> int:
            data = {
                "csrf": csrf_of(pages[i]),
                "version": version_of(pages[i]),
                "action": "correct",
                "text": f"reader {i}",
            }
            return clients[i].post(f"/regions/{flagged}/review", data=data).status_code

        with ThreadPoolExecutor(2) as pool:
            codes = sorted(pool.map(post, range(2)))
    assert codes == [303, 409]
    assert len(reviews(review_db, flagged)) == 1
