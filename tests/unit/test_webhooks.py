"""Webhook signatures, the SSRF guard, the one-claim rule and a refused delivery recorded;
the API's body limit and rate limiter. SQLite, no network: the guard refuses before any
request is made."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from ocrfleet import client, ir
from ocrfleet.api.keys import KeyCache, add_key, key_hash, revoke_key
from ocrfleet.api.limits import BodyLimit, RateLimiter
from ocrfleet.config import Settings
from ocrfleet.db.migrate import upgrade
from ocrfleet.db.models import ApiKey, Delivery, Document, Run
from ocrfleet.db.session import dispose_engines, session_scope
from ocrfleet.webhooks import (
    UnsafeCallbackURL,
    check_url,
    claim,
    deliver,
    key_id_of,
    sign,
    verify,
)


def test_signature_round_trip_and_replay_window() -> None:
    body = b'{"id": 1, "status": "done"}'
    header = sign("s3cret", body, timestamp=1_700_000_000, key_id="7")
    assert header.startswith("t=1700000000,kid=7,v1=") and key_id_of(header) == "7"
    assert verify("s3cret", header, body, now=1_700_000_100)
    assert not verify("s3cret", header, body + b" ", now=1_700_000_100)  # body changed
    assert not verify("other", header, body, now=1_700_000_100)  # wrong secret
    assert not verify("s3cret", header, body, now=1_700_000_000 + 301)  # replayed later
    assert not verify("s3cret", "garbage", body)
    forged = header.replace("t=1700000000", "t=1700000200")  # newer stamp, old signature
    assert not verify("s3cret", forged, body, now=1_700_000_200)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "https://10.1.2.3/hook",
        "http://169.254.169.254/latest/meta-data",  # cloud metadata
        "http://[::1]/hook",
        "http://192.168.0.10/hook",
        "http://0.0.0.0/hook",
    ],
)
def test_private_and_loopback_callbacks_are_refused(url: str) -> None:
    with pytest.raises(UnsafeCallbackURL, match="not allowed"):
        check_url(url, allow_private=False)
    check_url(url, allow_private=True)


def test_callback_url_shape() -> None:
    check_url("https://93.184.216.34/hook", allow_private=False)  # a public address
    for bad in ("ftp://93.184.216.34/x", "http:///nohost", "file:///etc/passwd", "hook"):
        with pytest.raises(UnsafeCallbackURL, match="http"):
            check_url(bad, allow_private=True)


@pytest.fixture
def db(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    upgrade(url)
    with session_scope(url) as session:
        session.add(Run(id="r" * 64, config={}))
    yield url
    dispose_engines()


def _document(url: str, status: str, callback_url: str | None) -> int:
    with session_scope(url) as session:
        doc = Document(
            run_id="r" * 64,
            sha256=status[0] * 64,
            source_uri="x",
            status=status,
            page_count=2,
            callback_url=callback_url,
        )
        session.add(doc)
        session.flush()
        return doc.id


def test_one_claim_per_finished_document(db: str) -> None:
    running = _document(db, "processing", "https://93.184.216.34/hook")
    done = _document(db, "done", "https://93.184.216.34/hook")
    silent = _document(db, "failed", None)
    with session_scope(db) as session:
        assert not claim(session, running)  # not finished: nothing to say yet
        assert not claim(session, silent)  # nowhere to say it
        assert claim(session, done)
        assert not claim(session, done)  # the second caller loses


def test_a_refused_callback_is_recorded_and_never_retried(db: str) -> None:
    settings = Settings(_env_file=None, database_url=db, webhook_secret="s")  # type: ignore[call-arg]
    doc_id = _document(db, "done", "http://127.0.0.1:9/hook")
    with session_scope(db) as session:
        assert claim(session, doc_id)
    outcome = deliver(settings, doc_id)
    assert outcome.final and not outcome.delivered and outcome.status_code is None
    assert outcome.error is not None and "not allowed" in outcome.error
    with session_scope(db) as session:
        (row,) = session.query(Delivery).all()
        assert (row.attempt, row.event, row.status_code) == (1, "done", None)
        assert row.delivery == f"{doc_id}-done"
        assert session.get(Document, doc_id).callback_state == "gave_up"
    assert deliver(settings, doc_id).error == "not due"  # a redelivered task sends nothing


def test_cancel_only_moves_unfinished_documents(db: str) -> None:
    settings = Settings(_env_file=None, database_url=db)  # type: ignore[call-arg]
    running = _document(db, "processing", None)
    done = _document(db, "done", None)
    assert client.cancel(running, settings=settings).status == ir.DocumentStatus.cancelled
    assert client.cancel(done, settings=settings).status == ir.DocumentStatus.done
    with pytest.raises(LookupError):
        client.cancel(999, settings=settings)


def test_keys_are_stored_hashed_and_revocable(db: str) -> None:
    with session_scope(db) as session:
        key_id, key = add_key(session, "acme")
    with session_scope(db) as session:
        (row,) = session.query(ApiKey).all()
        assert row.key_hash == key_hash(key) and key not in row.key_hash
        assert row.webhook_secret.startswith("whsec_") and row.webhook_secret != key
    cache = KeyCache()
    assert cache.tenant(db, key) == "acme" and cache.key_id(key) == key_id
    assert cache.tenant(db, key + "x") is None
    with session_scope(db) as session:
        assert revoke_key(session, key_id) and not revoke_key(session, key_id)
    assert KeyCache().tenant(db, key) is None
    with pytest.raises(ValueError), session_scope(db) as session:
        add_key(session, "")


def test_rate_limiter_allows_the_burst_then_the_rate() -> None:
    limiter = RateLimiter(rate=20.0, burst=5)
    assert [limiter.take("k") for _ in range(5)] == [0.0] * 5
    wait = limiter.take("k")
    assert 0 < wait <= 1 / 20
    assert limiter.take("other") == 0.0  # per key
    time.sleep(wait + 0.01)
    assert limiter.take("k") == 0.0


async def _echo(scope, receive, send) -> None:  # noqa: ANN001 - a bare ASGI app
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def test_body_limit_refuses_declared_and_streamed_bodies() -> None:
    app = BodyLimit(_echo, limit=1000)

    async def post(content) -> httpx.Response:  # noqa: ANN001
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            return await http.post("/", content=content)

    async def chunks(n: int):  # noqa: ANN202 - no Content-Length: chunked
        for _ in range(n):
            yield b"x" * 100

    assert asyncio.run(post(b"x" * 1000)).text == "1000"
    assert asyncio.run(post(b"x" * 1001)).status_code == 413
    assert asyncio.run(post(chunks(10))).text == "1000"
    assert asyncio.run(post(chunks(11))).status_code == 413


def test_migration_0008_gives_existing_keys_and_deliveries_their_own_values(tmp_path) -> None:
    """Keys made before 0008 get a secret each (never a shared one); attempts made before it
    belong to the completion's delivery id."""
    from sqlalchemy import text

    from ocrfleet.db.migrate import downgrade
    from ocrfleet.db.session import get_engine

    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url, "0007")
    with get_engine(url).begin() as conn:
        conn.execute(text("INSERT INTO runs (id, config, created_at) VALUES ('r', '{}', 0)"))
        conn.execute(
            text(
                "INSERT INTO documents (id, run_id, sha256, tenant, source_uri, pages_done, "
                "pages_failed, status, priority, created_at, updated_at) "
                "VALUES (4, 'r', 's', '', 'x', 0, 0, 'done', 'normal', 0, 0)"
            )
        )
        for key in ("a", "b"):
            conn.execute(
                text("INSERT INTO api_keys (tenant, key_hash, created_at) VALUES (:t, :h, 0)"),
                {"t": key, "h": key * 64},
            )
        conn.execute(
            text(
                "INSERT INTO deliveries (document_id, attempt, url, event, created_at) "
                "VALUES (4, 1, 'http://x', 'done', 0)"
            )
        )
    dispose_engines()
    upgrade(url)
    with get_engine(url).connect() as conn:
        secrets = [s for (s,) in conn.execute(text("SELECT webhook_secret FROM api_keys"))]
        delivery = conn.execute(text("SELECT delivery FROM deliveries")).scalar_one()
    assert len(set(secrets)) == 2 and all(s.startswith("whsec_") for s in secrets)
    assert delivery == "4-done"
    dispose_engines()
    downgrade(url, "0007")
    upgrade(url)
    dispose_engines()
