"""Finding 8: login throttling holds under parallel guesses and across app processes (the
count is in the database, taken before the password is hashed), the number of password
hashes running at once is bounded per process, and a proxy that hides client addresses
does not turn a few failures into everyone's lockout."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ocrfleet.db.session import session_scope
from ocrfleet.review.users import add_user
from tests.integration.review.helpers import PASSWORD, World, csrf_of
from tests.security import reviewing
from tests.security.reviewing import Server, client, login, serve

world, review_db = reviewing.world, reviewing.review_db  # the fixtures
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
GUESSES = 40
ARGON2_MB = 64  # argon2-cffi's default memory cost per hash


def ready_guess(server: Server, name: str, **headers: str) -> tuple[httpx.Client, str]:
    """A client with its login form's CSRF token, so the guesses themselves go at once."""
    http = client(server, **headers)
    return http, csrf_of(http.get("/login").text)


def guess_all(guesses: list[tuple[httpx.Client, str, str, str]]) -> Counter[int]:
    def one(guess: tuple[httpx.Client, str, str, str]) -> int:
        http, token, name, password = guess
        data = {"csrf": token, "name": name, "password": password}
        return http.post("/login", data=data).status_code

    with ThreadPoolExecutor(len(guesses)) as pool:
        return Counter(pool.map(one, guesses))


@pytest.mark.finding(
    8,
    before="40 parallel wrong guesses all got 401, none 429",
    after="5 got 401 and 35 got 429, over two app processes sharing the count",
)
def test_parallel_guesses_over_two_processes_stop_at_the_limit(
    review_db: str, world: World
) -> None:
    with serve(review_db, world) as one, serve(review_db, world) as two:
        guesses = []
        for i in range(GUESSES):
            http, token = ready_guess(one if i % 2 else two, "alice")
            guesses.append((http, token, "alice", f"wrong guess {i}"))
        codes = guess_all(guesses)
        assert codes == Counter({401: 5, 429: GUESSES - 5})
        # From the same place even the right password waits out the window; alice
        # herself, elsewhere, still gets in: the name's own limit is not reached.
        assert login(client(one), "alice").status_code == 429
        assert login(client(two, **{"X-Forwarded-For": "10.1.2.3"}), "alice").status_code == 303


@pytest.mark.finding(
    8,
    before="behind a proxy without X-Forwarded-For, 5 failures locked out every user",
    after="only the failing name is stopped at that address; other users log in",
)
def test_a_shared_proxy_address_locks_out_no_one_else(review_db: str, world: World) -> None:
    with session_scope(review_db) as session:
        add_user(session, "carol", PASSWORD, "reviewer", "acme")
    with serve(review_db, world) as server:  # every request from the proxy's 127.0.0.1
        for _ in range(5):
            assert login(client(server), "alice", "wrong password").status_code == 401
        assert login(client(server), "alice", "wrong password").status_code == 429
        for name in ("bob", "carol", "root"):
            assert login(client(server), name).status_code == 303, name


@pytest.mark.finding(
    8,
    before="each of 40 parallel guesses hashed at once: the app grew from 162 MB to 1.1 GB",
    after="at most OCRFLEET_REVIEW_MAX_HASHES (2 here) hashes at once: peak grows < 300 MB",
)
def test_password_hashes_at_once_are_bounded(review_db: str, world: World) -> None:
    slots = 2
    with serve(review_db, world, review_max_hashes=slots) as server:
        assert login(client(server), "alice").status_code == 303  # warm: one hash done
        baseline = server.peak_rss_mb()
        # Different names from different addresses: no throttle applies, every guess
        # is hashed, and only the slots bound how many at once.
        guesses = []
        for i in range(GUESSES):
            http, token = ready_guess(server, f"user{i}", **{"X-Forwarded-For": f"10.9.0.{i}"})
            guesses.append((http, token, f"user{i}", "wrong password"))
        codes = guess_all(guesses)
        grown = server.peak_rss_mb() - baseline
    # Each guess is hashed and refused, or, after waiting HASH_WAIT_S for a slot, told to
    # come back (503); none is throttled, let in, or crashes.
    assert set(codes) <= {401, 503} and codes[401] >= slots, codes
    print(f"peak RSS grew {grown:.0f} MB over {GUESSES} parallel guesses ({dict(codes)}), "
          f"{slots} hash slots")
    assert grown < slots * ARGON2_MB + 170
