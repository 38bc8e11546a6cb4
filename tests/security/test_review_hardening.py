"""Findings 11, 12 and 13 in the review app: odd input is a 4xx with a one-line reason,
never a 500; a too-short secret is refused without echoing it; every response carries the
security headers (a CSP with a nonce and no inline script besides); looking at a region
claims nothing; the `error` parameter shows only fixed messages."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from ocrfleet.db.models import ReviewFlag
from ocrfleet.db.session import session_scope
from tests.integration.review.helpers import World, csrf_of, version_of
from tests.security import reviewing
from tests.security.reviewing import client, logged_in, ocrfleet, regions_of, serve

world, review_db = reviewing.world, reviewing.review_db  # the fixtures
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
BIG = str(2**63)  # one past BIGINT


@pytest.mark.finding(
    11,
    before="document=², ids over 2^63, a NUL in a filter: 500 and a dropped connection",
    after="400 or 404 with a one-line reason",
)
def test_odd_input_gets_a_one_line_4xx(review_db: str, world: World) -> None:
    region = regions_of(review_db, world.documents["photo.jpg"], flagged=True)[0]
    with serve(review_db, world) as server:
        root = logged_in(server, "root")
        gets = {
            "/queue?document=%C2%B2": 400,
            "/queue?document=-1": 400,
            f"/queue?document={BIG}": 400,
            "/queue?reason=a%00b": 400,
            "/queue?tenant=a%00": 400,
            "/queue?run=" + "r" * 5000: 400,
            f"/regions/{BIG}": 404,
            f"/regions/{2**64 + 7}/crop.png": 404,
            f"/documents/{BIG}": 404,
            f"/documents/{BIG}/pages/{BIG}.jpg": 404,
            f"/regions/{region}/rendered/%00.png": 404,
            f"/regions/{region}?document=%C2%B2": 400,
        }
        for path, status in gets.items():
            response = root.get(path)
            assert response.status_code == status, (path, response.status_code)
            assert response.text.count("\n") == 0 and 0 < len(response.text) < 200, path
        page = root.get(f"/regions/{region}").text
        form = {"csrf": csrf_of(page), "version": version_of(page)}
        posts = {
            f"/regions/{BIG}/review": ({**form, "action": "unreadable"}, 404),
            f"/regions/{region}/review": ({**form, "action": "\x00"}, 400),
            f"/regions/{region}/review?document=%C2%B2": ({**form, "action": "skip"}, 400),
            f"/regions/{region}/review ": ({**form, "action": "skip", "version": BIG}, 400),
        }
        for path, (data, status) in posts.items():
            response = root.post(path.strip(), data=data)
            assert response.status_code == status, (path, data, response.status_code)
        # A correction with a NUL is refused back to the region with a fixed message.
        response = root.post(
            f"/regions/{region}/review", data={**form, "action": "correct", "text": "a\x00b"}
        )
        assert response.status_code == 303 and "error=bad_text" in response.headers["location"]
        assert root.post("/next", content=b"x" * (2 << 20)).status_code == 413
        anonymous = client(server)
        for name in ("a\x00b", "n" * 500, ""):
            token = csrf_of(anonymous.get("/login").text)
            response = anonymous.post("/login", data={"csrf": token, "name": name})
            assert response.status_code == 400, name


@pytest.mark.finding(
    12,
    before="a too-short OCRFLEET_REVIEW_SECRET was echoed in the error",
    after="refused (exit 2) naming the variable, never its value",
)
def test_a_short_secret_is_refused_without_echo(review_db: str, world: World) -> None:
    secret = "hunter2-but-short"
    done = ocrfleet(["review", "--port", "9"], review_db, world, review_secret=secret)
    assert done.returncode == 2
    assert "OCRFLEET_REVIEW_SECRET" in done.stderr
    assert secret not in done.stderr + done.stdout


@pytest.mark.finding(
    13,
    before="no CSP, X-Frame-Options, nosniff, Referrer-Policy or no-store; GET claimed",
    after="every response has them (CSP nonce, no unsafe-inline); claims only on POST",
)
def test_headers_on_every_response_and_no_claim_on_get(review_db: str, world: World) -> None:
    region = regions_of(review_db, world.documents["photo.jpg"], flagged=True)[0]
    with serve(review_db, world) as server:
        alice = logged_in(server, "alice")
        responses = [
            client(server).get("/login"),
            client(server).get("/queue"),  # redirect to login
            client(server).get(f"/regions/{region}/crop.png"),  # 401
            alice.get("/queue"),
            alice.get(f"/regions/{region}"),
            alice.get(f"/regions/{region}/crop.png"),
            alice.get("/no-such-page"),
            alice.get("/next"),  # 405: claims are POSTs
        ]
        assert [r.status_code for r in responses] == [200, 303, 401, 200, 200, 200, 404, 405]
        for response in responses:
            headers = response.headers
            csp = headers["content-security-policy"]
            assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
            assert headers["x-frame-options"] == "DENY"
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "same-origin"
            assert headers["cache-control"] == "no-store"
        page = responses[4]
        nonce = re.search(r"'nonce-([^']+)'", page.headers["content-security-policy"]).group(1)
        scripts = re.findall(r"<script([^>]*)>", page.text)
        assert scripts and all(f'nonce="{nonce}"' in attrs for attrs in scripts)
        markup = re.sub(r"<script.*?</script>", "", page.text, flags=re.S)
        assert not re.search(r"\s(style|on[a-z]+)=", markup)  # no inline style or handlers
        # Looking claimed nothing; the POST that starts reviewing does.
        with session_scope(review_db) as session:
            assert session.scalars(select(ReviewFlag.claimed_by)).all() == [None] * len(
                session.scalars(select(ReviewFlag.id)).all()
            )
        token = csrf_of(alice.get("/queue").text)
        started = alice.post("/next", data={"csrf": token})
        assert started.status_code == 303 and "/regions/" in started.headers["location"]
        with session_scope(review_db) as session:
            assert len([c for c in session.scalars(select(ReviewFlag.claimed_by)) if c]) == 1


@pytest.mark.finding(
    13,
    before="?error= showed attacker-worded text on the region page",
    after="only codes mapped to fixed messages; any other value shows nothing",
)
def test_the_error_parameter_shows_only_fixed_messages(review_db: str, world: World) -> None:
    region = regions_of(review_db, world.documents["photo.jpg"], flagged=True)[0]
    with serve(review_db, world) as server:
        alice = logged_in(server, "alice")
        lure = "Your session expired: call +1 555 0100 with your password"
        page = alice.get(f"/regions/{region}", params={"error": lure}).text
        assert "555 0100" not in page and 'id="error"' not in page
        page = alice.get(f"/regions/{region}", params={"error": "no_text"}).text
        assert re.search(r'id="error">A correction needs the text', page)
