"""Finding 6: review sessions can be revoked. Logout, `ocrfleet users disable` and
`ocrfleet users passwd` void every cookie the account holds, including copies made
before; `users remove` deletes an account but never one the history names."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from ocrfleet.db.models import User
from ocrfleet.db.session import session_scope
from tests.integration.review.helpers import PASSWORD, World, csrf_of
from tests.security import reviewing
from tests.security.reviewing import (
    client,
    logged_in,
    login,
    ocrfleet,
    serve,
)

world, review_db = reviewing.world, reviewing.review_db  # the fixtures
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.finding(
    6,
    before="a cookie copied before logout still read and wrote after it",
    after="logout, disable and passwd void every cookie of the account (303 to /login, 401)",
)
def test_logout_voids_a_copied_cookie(review_db: str, world: World) -> None:
    with serve(review_db, world) as server:
        alice = logged_in(server, "alice")
        stolen = client(server)
        stolen.cookies.update(alice.cookies)
        assert stolen.get("/queue").status_code == 200  # the copy works while logged in
        token = csrf_of(alice.get("/queue").text)
        assert alice.post("/logout", data={"csrf": token}).status_code == 303
        assert stolen.get("/queue").status_code == 303  # to /login
        assert stolen.post("/next", data={"csrf": token}).status_code == 401
        # Logging in again works, and the old copy stays dead.
        again = logged_in(server, "alice")
        assert again.get("/queue").status_code == 200
        assert stolen.get("/queue").status_code == 303


@pytest.mark.finding(6)
def test_disable_passwd_and_remove_from_the_cli(review_db: str, world: World) -> None:
    with serve(review_db, world) as server:
        alice, bob = logged_in(server, "alice"), logged_in(server, "bob")

        disabled = ocrfleet(["users", "disable", "alice"], review_db, world)
        assert disabled.returncode == 0, disabled.stderr
        assert alice.get("/queue").status_code == 303
        assert login(client(server), "alice").status_code == 401
        assert ocrfleet(["users", "enable", "alice"], review_db, world).returncode == 0
        assert login(client(server), "alice").status_code == 303
        assert alice.get("/queue").status_code == 303  # enabling revives no old cookie

        # A password is never an argument, only stdin or the prompt.
        refused = ocrfleet(["users", "passwd", "bob", "new password 1"], review_db, world)
        assert refused.returncode == 2
        new = "a new password for bob"
        changed = ocrfleet(["users", "passwd", "bob", "--password-stdin"], review_db, world, new)
        assert changed.returncode == 0, changed.stderr
        assert bob.get("/queue").status_code == 303
        assert login(client(server), "bob", PASSWORD).status_code == 401
        assert login(client(server), "bob", new).status_code == 303

    listed = ocrfleet(["users", "list"], review_db, world)
    assert listed.returncode == 0
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in listed.stdout.splitlines()}
    assert rows["alice"] == ["reviewer", "tenant acme", "active"]
    assert rows["root"] == ["admin", "every tenant", "active"]

    added = ocrfleet(["users", "add", "temp", "--password-stdin"], review_db, world, PASSWORD)
    assert added.returncode == 0, added.stderr
    assert "documents without a tenant" in added.stderr
    assert ocrfleet(["users", "remove", "temp"], review_db, world).returncode == 0
    missing = ocrfleet(["users", "remove", "temp"], review_db, world)
    assert missing.returncode == 2 and "no user" in missing.stderr
    with session_scope(review_db) as session:
        assert session.scalar(select(User.id).where(User.name == "temp")) is None
