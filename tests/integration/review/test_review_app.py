"""Working the queue through the real app: reviews close flags, the final text comes back
through the one loader, the SQL views and `ocrfleet results`, claims keep two reviewers
apart, and the engines' candidates are never touched."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import select, text, update
from starlette.testclient import TestClient

from ocrfleet.db.models import Candidate, Document, Page, Region, Review, ReviewFlag, utcnow
from ocrfleet.db.persist import load_page_result
from ocrfleet.db.session import session_scope
from ocrfleet.review.app import create_app
from tests.integration.review.helpers import (
    World,
    csrf_of,
    login,
    ocrfleet_cli,
    settings_for,
    version_of,
)

pytestmark = pytest.mark.integration


def candidates_of(url: str) -> list[tuple]:
    with session_scope(url) as session:
        return [
            tuple(row)
            for row in session.execute(
                select(Candidate.id, Candidate.region_id, Candidate.engine, Candidate.text)
                .order_by(Candidate.id)
            ).all()
        ]


def open_flags(url: str, document_id: int, category: str | None = None) -> list[int]:
    query = (
        select(ReviewFlag.region_id)
        .join(Region, Region.id == ReviewFlag.region_id)
        .join(Page, Page.id == Region.page_id)
        .where(Page.document_id == document_id, ReviewFlag.status == "open")
        .order_by(ReviewFlag.id)
    )
    if category is not None:
        query = query.where(Region.category == category)
    with session_scope(url) as session:
        return list(session.scalars(query).all())


def next_region(client: TestClient, **filters: str) -> int | None:
    token = csrf_of(client.get("/queue").text)
    response = client.post("/next", params=filters, data={"csrf": token}, follow_redirects=False)
    assert response.status_code == 303
    found = re.match(r"/regions/(\d+)", response.headers["location"])
    return int(found.group(1)) if found else None


def decide(client: TestClient, region_id: int, **form: str) -> int:
    page = client.get(f"/regions/{region_id}")
    assert page.status_code == 200
    response = client.post(
        f"/regions/{region_id}/review",
        data={"csrf": csrf_of(page.text), "version": version_of(page.text), **form},
        follow_redirects=False,
    )
    return response.status_code


def test_reviewing_every_flag_makes_the_document_reviewed(review_db: str, world: World) -> None:
    document_id = world.documents["photo.jpg"]
    flagged = open_flags(review_db, document_id)
    assert len(flagged) >= 2, "the example should flag at least two regions"
    before = candidates_of(review_db)
    client = TestClient(create_app(settings_for(review_db, world)))
    login(client, "alice")

    queue = client.get("/queue").text
    counts = dict(re.findall(r'class="flag"><a[^>]*>([^<]+)</a></td><td>(\d+)</td>', queue))
    assert sum(int(n) for n in counts.values()) == len(flagged)

    corrected_region = next_region(client)
    assert corrected_region == flagged[0]  # oldest first
    assert decide(client, corrected_region, action="correct", text="Reviewed By Alice 42") == 303
    accepted: list[int] = []
    while (region_id := next_region(client)) is not None:
        assert decide(client, region_id, action="accept:rapidocr") == 303
        accepted.append(region_id)
    assert sorted([corrected_region, *accepted]) == sorted(flagged)

    with session_scope(review_db) as session:
        assert session.get(Document, document_id).status == "reviewed"
        assert session.get(Document, world.documents["memo.tif"]).status == "done"
        reviews = session.execute(select(Review.region_id, Review.action)).all()
        assert sorted(reviews) == sorted(
            [(corrected_region, "correct"), *((r, "accept") for r in accepted)]
        )
        flags = session.scalars(
            select(ReviewFlag).where(ReviewFlag.region_id.in_(flagged))
        ).all()
        assert {f.status for f in flags} == {"resolved"}
        page_id, number = session.execute(
            select(Region.page_id, Region.number).where(Region.id == corrected_region)
        ).one()
        result = load_page_result(session, page_id)
        assert result.region_text(number) == "Reviewed By Alice 42"
        (review,) = [r for r in result.reviews if r.region_number == number]
        assert (review.reviewer, review.action.value) == ("alice", "correct")
        line = session.execute(
            text(
                "SELECT text, reviewed_by, review_action FROM document_text_lines "
                "WHERE document_id = :d AND region_number = :n"
            ),
            {"d": document_id, "n": number},
        ).one()
        assert tuple(line) == ("Reviewed By Alice 42", "alice", "correct")
    assert candidates_of(review_db) == before  # nothing overwritten

    as_text = ocrfleet_cli(["results", str(document_id)], review_db, world)
    assert as_text.returncode == 0, as_text.stderr
    assert "Reviewed By Alice 42" in as_text.stdout.splitlines()
    as_json = json.loads(ocrfleet_cli(["results", str(document_id), "--format", "json"],
                                      review_db, world).stdout)  # fmt: skip
    assert as_json["status"] == "reviewed"
    reviewers = {
        r["review"]["reviewer"] for p in as_json["pages"] for r in p["regions"] if r["review"]
    }
    assert reviewers == {"alice"}

    document = client.get(f"/documents/{document_id}").text
    assert 'id="status">reviewed<' in document
    assert "Reviewed By Alice 42" in document
    assert 'data-state="correct"' in document and 'data-state="open"' not in document


def test_claims_keep_reviewers_apart_until_they_lapse(review_db: str, world: World) -> None:
    app = create_app(settings_for(review_db, world))
    alice, root = TestClient(app), TestClient(app)
    login(alice, "alice")
    login(root, "root")
    document = str(world.documents["photo.jpg"])
    mine = next_region(alice, document=document)
    theirs = next_region(root, document=document)
    assert mine is not None and theirs is not None and theirs != mine
    # Working a region someone else holds is refused, and nothing is recorded.
    assert decide(root, mine, action="accept:rapidocr") == 409
    # A lapsed claim is free again: root gets alice's region next.
    with session_scope(review_db) as session:
        session.execute(
            update(ReviewFlag)
            .where(ReviewFlag.region_id == mine)
            .values(claimed_until=utcnow() - timedelta(seconds=1))
        )
    assert decide(root, theirs, action="unreadable") == 303
    assert next_region(root, document=document) == mine
    with session_scope(review_db) as session:
        assert session.scalars(select(Review.action)).all() == ["unreadable"]
        assert session.scalars(
            select(ReviewFlag.resolved_text).where(ReviewFlag.region_id == theirs)
        ).all() == [""]


def test_skip_filters_and_counts(review_db: str, world: World) -> None:
    client = TestClient(create_app(settings_for(review_db, world)))
    login(client, "root")
    photo, memo = world.documents["photo.jpg"], world.documents["memo.tif"]
    all_flags = open_flags(review_db, photo) + open_flags(review_db, memo)
    queue = client.get("/queue").text
    assert set(map(int, re.findall(r'<a href="/regions/(\d+)\?', queue))) == set(all_flags)
    only_globex = client.get("/queue", params={"tenant": "globex"}).text
    listed = set(map(int, re.findall(r'<a href="/regions/(\d+)\?', only_globex)))
    assert listed == set(open_flags(review_db, memo))
    by_document = client.get("/queue", params={"document": str(photo), "category": "text"})
    listed = set(map(int, re.findall(r'<a href="/regions/(\d+)\?', by_document.text)))
    assert listed and listed == set(open_flags(review_db, photo, category="text"))
    assert not re.findall(r'<a href="/regions/(\d+)\?', client.get(
        "/queue", params={"run": "no-such-run"}).text)  # fmt: skip
    reasons = re.findall(r'class="flag"><a[^>]*>([^<]+)</a></td><td>(\d+)</td>', queue)
    first_reason = reasons[0][0]
    listed = re.findall(
        r'<a href="/regions/(\d+)\?[^"]*">#\d+</a></td>\s*<td class="flag">([^<]+?)[ <]',
        client.get("/queue", params={"reason": first_reason}).text,
    )
    assert listed and {reason for _, reason in listed} == {first_reason}

    skipped = next_region(client, document=str(photo))
    assert skipped is not None
    assert decide(client, skipped, action="skip") == 303
    after = next_region(client, document=str(photo))
    assert after not in (None, skipped)
    assert skipped in open_flags(review_db, photo)  # a skip decides nothing
    # A correction without text is refused back to the region, not recorded.
    assert decide(client, after, action="correct", text="   ") == 303
    with session_scope(review_db) as session:
        assert session.scalars(select(Review.action)).all() == ["skip"]
