"""Finding 11, fuzzed: Hypothesis sends hostile requests to every route of the review app
(every method it answers, anonymous, as a reviewer and as an admin, with and without the
CSRF token) served by `ocrfleet review` in its own process; no response may be a 5xx or
a dropped connection. OCRFLEET_FUZZ_EXAMPLES sets the number of requests (CI: 300)."""

from __future__ import annotations

import os
from collections import Counter
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from ocrfleet.review.app import create_app
from tests.integration.review.helpers import World, csrf_of, settings_for
from tests.security import reviewing
from tests.security.reviewing import client, login, regions_of, serve

world, review_db = reviewing.world, reviewing.review_db  # the fixtures
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
EXAMPLES = int(os.environ.get("OCRFLEET_FUZZ_EXAMPLES", "300"))
ACCOUNTS = ("anonymous", "alice", "root")  # none, a tenant's reviewer, a global admin

SPECIAL = [
    "0", "00", "-1", "²", "١٢", "1e3", " 1", "1 ", str(2**63 - 1), str(2**63), str(2**64),
    "9" * 40, "\x00", "a\x00b", "%00", "..", "../../etc/passwd", "rapidocr", "accept:rapidocr",
    "<script>alert(1)</script>", "' OR 1=1 --", "\u202e", "\ufeff", "a" * 3000, "",
]  # fmt: skip
hostile_text = st.one_of(
    st.sampled_from(SPECIAL),
    st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
FILTER_KEYS = ["document", "reason", "category", "run", "tenant", "error", "next", "finished"]
FORM_KEYS = ["action", "text", "version", "name", "password", "next", "engine"]
BODY_TYPES = ["application/json", "multipart/form-data; boundary=x", "text/plain", "", "a/b"]


def routes() -> list[tuple[str, str]]:
    """Every (method, path template) the app answers."""
    app = create_app(settings_for("sqlite://", World("", "file:///nonexistent", {})))
    found = []
    for route in app.routes:
        assert isinstance(route, Route)
        found += [(m, route.path) for m in sorted(route.methods or ()) if m != "HEAD"]
    return found


ROUTES = routes()


@st.composite
def requests(draw: st.DrawFn, route: tuple[str, str], ids: list[str]) -> dict:
    method, template = route
    path = template
    for param in ("{region_id:int}", "{document_id:int}", "{number:int}", "{engine}"):
        if param in path:
            value = draw(st.one_of(st.sampled_from(ids), hostile_text))
            path = path.replace(param, quote(value, safe=""))
    query = draw(
        st.dictionaries(st.one_of(st.sampled_from(FILTER_KEYS), st.text(max_size=8)),
                        hostile_text, max_size=4)
    )  # fmt: skip
    request = {
        "account": draw(st.sampled_from(ACCOUNTS)),
        "method": method,
        "route": template,
        "path": path,
        "params": query,
        "csrf": draw(st.sampled_from(["valid", "missing", "forged"])),
        "form": draw(st.dictionaries(st.sampled_from(FORM_KEYS), hostile_text, max_size=5)),
        "raw": None,
    }
    if method == "POST" and draw(st.integers(0, 9)) == 0:  # now and then a body of another kind
        request["raw"] = (draw(st.sampled_from(BODY_TYPES)), draw(st.binary(max_size=300)))
    return request


@pytest.mark.finding(
    11,
    before="odd input to the review app raised 500s and dropped the connection",
    after="fuzzed over every route and method: 0 responses >= 500",
)
def test_no_route_answers_500(review_db: str, world: World) -> None:
    photo = world.documents["photo.jpg"]
    ids = [str(i) for i in regions_of(review_db, photo, flagged=True)[:2]]
    ids += [str(photo), str(world.documents["memo.tif"]), "1"]
    statuses: Counter[int] = Counter()
    seen: set[tuple[str, str]] = set()
    addresses = iter(range(1, 10**6))
    with serve(review_db, world) as server:
        clients: dict[str, tuple[httpx.Client, str]] = {}

        def session_of(account: str) -> tuple[httpx.Client, str]:
            """A logged-in client and its CSRF token (again after a fuzzed logout), each
            login from its own address so fuzzed wrong passwords throttle no re-login."""
            if account not in clients:
                http = client(server, **{"X-Forwarded-For": f"10.7.{next(addresses)}.1"})
                if account != "anonymous":
                    assert login(http, account).status_code == 303
                clients[account] = (http, csrf_of(http.get("/login").text))
            return clients[account]

        # Every route gets its share of the examples: Hypothesis does not draw a route
        # uniformly, and a route it never drew would go unfuzzed.
        def fuzz(route: tuple[str, str]) -> None:
            @settings(
                max_examples=max(1, EXAMPLES // len(ROUTES)),
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(st.data())
            def one(data: st.DataObject) -> None:
                request = data.draw(requests(route, ids))
                http, token = session_of(request["account"])
                form = dict(request["form"])
                if request["csrf"] != "missing":
                    form["csrf"] = token if request["csrf"] == "valid" else "forged"
                kwargs: dict = {"params": request["params"]}
                if request["method"] == "POST":
                    if request["raw"]:
                        kind, body = request["raw"]
                        kwargs.update(content=body, headers={"content-type": kind} if kind else {})
                    else:
                        kwargs["data"] = form
                response = http.request(request["method"], request["path"], **kwargs)
                statuses[response.status_code] += 1
                seen.add((request["method"], request["route"]))
                assert response.status_code < 500, (request, response.status_code, response.text)
                if request["path"] == "/logout" and response.status_code == 303:
                    clients.pop(request["account"])  # that session is over: log in again

            one()

        for route in ROUTES:
            fuzz(route)
    total = sum(statuses.values())
    errors = sum(n for status, n in statuses.items() if status >= 500)
    print(f"review app fuzz: {total} requests over {len(ROUTES)} route methods, "
          f"statuses {dict(sorted(statuses.items()))}, {errors} >= 500")
    assert errors == 0
    if EXAMPLES >= 200:
        assert seen == set(ROUTES), set(ROUTES) - seen
