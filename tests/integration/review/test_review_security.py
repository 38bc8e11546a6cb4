"""The review app's locks: no page without a login, no form without the CSRF token, no
region of another tenant, no password guessing. The real app on a real PostgreSQL copy
of real pipeline output, through Starlette's in-process client."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select
from starlette.routing import Route
from starlette.testclient import TestClient

from ocrfleet.db.models import Page, Region, Review, ReviewFlag
from ocrfleet.db.session import session_scope
from ocrfleet.review.app import create_app
from tests.integration.review.helpers import (
    PASSWORD,
    World,
    csrf_of,
    login,
    settings_for,
)

pytestmark = pytest.mark.integration


def flagged_region(url: str, document_id: int) -> int:
    with session_scope(url) as session:
        return session.scalars(
            select(Region.id)
            .join(Page, Page.id == Region.page_id)
            .join(ReviewFlag, ReviewFlag.region_id == Region.id)
            .where(Page.document_id == document_id)
            .order_by(Region.id)
        ).first()


def concrete(path: str, region_id: int, document_id: int) -> str:
    return (
        path.replace("{region_id:int}", str(region_id))
        .replace("{document_id:int}", str(document_id))
        .replace("{number:int}", "1")
        .replace("{engine}", "rapidocr")
    )


def test_every_route_needs_a_login(review_db: str, world: World) -> None:
    app = create_app(settings_for(review_db, world))
    client = TestClient(app)
    document_id = world.documents["photo.jpg"]
    region_id = flagged_region(review_db, document_id)
    checked = 0
    for route in app.routes:
        assert isinstance(route, Route)
        if route.path == "/login":
            continue
        path = concrete(route.path, region_id, document_id)
        for method in route.methods or ():
            if method == "HEAD":
                continue
            response = client.request(method, path, follow_redirects=False)
            if response.status_code == 303:
                assert response.headers["location"].startswith("/login"), (method, path)
            else:
                assert response.status_code == 401, (method, path, response.status_code)
            checked += 1
    assert checked == len(app.routes) - 2  # all but GET and POST /login
    # And a page that redirects is really there once logged in.
    login(client, "root")
    assert client.get(f"/regions/{region_id}").status_code == 200


def test_session_cookie_is_signed_and_http_only(review_db: str, world: World) -> None:
    client = TestClient(create_app(settings_for(review_db, world)))
    token = csrf_of(client.get("/login").text)
    response = client.post(
        "/login",
        data={"csrf": token, "name": "alice", "password": PASSWORD},
        follow_redirects=False,
    )
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie
    # A tampered cookie is no session at all.
    value = client.cookies["ocrfleet_review"]
    assert client.get("/queue", follow_redirects=False).status_code == 200
    payload, signature = value.rsplit(".", 1)
    client.cookies.clear()
    client.cookies.set("ocrfleet_review", f"{payload}.{signature[::-1]}")
    assert client.get("/queue", follow_redirects=False).status_code == 303


def test_a_form_without_the_csrf_token_is_refused(review_db: str, world: World) -> None:
    client = TestClient(create_app(settings_for(review_db, world)))
    login(client, "alice")
    region_id = flagged_region(review_db, world.documents["photo.jpg"])
    page = client.get(f"/regions/{region_id}")
    assert page.status_code == 200
    for data in ({}, {"csrf": "forged"}):
        response = client.post(
            f"/regions/{region_id}/review",
            data={**data, "action": "correct", "text": "forged"},
            follow_redirects=False,
        )
        assert response.status_code == 403
    assert client.post("/logout", data={}, follow_redirects=False).status_code == 403
    with session_scope(review_db) as session:
        assert session.scalars(select(Review.id)).all() == []
    # The login form is a form too.
    fresh = TestClient(create_app(settings_for(review_db, world)))
    response = fresh.post("/login", data={"name": "alice", "password": PASSWORD})
    assert response.status_code == 403
    # With the token the same post goes through.
    response = client.post(
        f"/regions/{region_id}/review",
        data={"csrf": csrf_of(page.text), "version": "0", "action": "correct", "text": "fixed"},
        follow_redirects=False,
    )
    assert response.status_code == 303


def test_a_reviewer_sees_nothing_of_another_tenant(review_db: str, world: World) -> None:
    client = TestClient(create_app(settings_for(review_db, world)))
    login(client, "alice")  # tenant acme; memo.tif belongs to globex
    theirs = world.documents["memo.tif"]
    region_id = flagged_region(review_db, theirs)
    for path in (
        f"/regions/{region_id}",
        f"/regions/{region_id}/page.jpg",
        f"/regions/{region_id}/crop.png",
        f"/regions/{region_id}/rendered/rapidocr.png",
        f"/documents/{theirs}",
        f"/documents/{theirs}/pages/1.jpg",
    ):
        assert client.get(path).status_code == 404, path
    token = csrf_of(client.get("/queue").text)
    response = client.post(
        f"/regions/{region_id}/review",
        data={"csrf": token, "version": "0", "action": "correct", "text": "not mine"},
        follow_redirects=False,
    )
    assert response.status_code == 404
    queue = client.get("/queue", params={"tenant": "globex"}).text
    assert f"/regions/{region_id}?" not in queue
    assert f"/documents/{theirs}" not in queue
    # Working the queue to the end never reaches the other tenant's flags.
    with session_scope(review_db) as session:
        assert session.get(ReviewFlag, _flag_of(session, region_id)).status == "open"
    # The other tenant's reviewer and the admin do see it.
    for name in ("bob", "root"):
        other = TestClient(create_app(settings_for(review_db, world)))
        login(other, name)
        assert other.get(f"/regions/{region_id}").status_code == 200


def _flag_of(session, region_id: int) -> int:
    return session.scalars(select(ReviewFlag.id).where(ReviewFlag.region_id == region_id)).one()


def test_wrong_passwords_are_refused_then_throttled(review_db: str, world: World) -> None:
    client = TestClient(create_app(settings_for(review_db, world, review_login_attempts=3)))

    def attempt(password: str) -> int:
        token = csrf_of(client.get("/login").text)
        return client.post(
            "/login",
            data={"csrf": token, "name": "alice", "password": password},
            follow_redirects=False,
        ).status_code

    assert [attempt("wrong password") for _ in range(3)] == [401, 401, 401]
    assert attempt("wrong password") == 429
    assert attempt(PASSWORD) == 429  # even the right one, until the window passes
    assert client.get("/queue", follow_redirects=False).status_code == 303
    page = client.get("/login?next=/queue").text
    assert re.search(r'type="password"', page)
