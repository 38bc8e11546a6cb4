"""API keys: one tenant each, only the key's SHA-256 in the database, the key itself shown
once by `ocrfleet keys add`. Keys are 256-bit random, so a plain hash is enough (no
salt or slow hash: nothing to guess).

Each key also has its own webhook secret, the HMAC key that signs the callbacks of the
documents submitted with it (`kid=<key id>` in the signature header), so one tenant's
secret never verifies another's callbacks. An HMAC key must be at hand to sign, so it is
stored as is in `api_keys.webhook_secret`: whoever reads that table can sign as any
tenant, as whoever reads `documents` reads every tenant's results. It is shown by
`ocrfleet keys webhook-secret ID` and replaced by `ocrfleet keys rotate-webhook-secret ID`
(at once: a callback signed after the rotation verifies only with the new secret)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ocrfleet.db import models
from ocrfleet.db.models import utcnow
from ocrfleet.db.session import session_scope

PREFIX = "ofk_"
SECRET_PREFIX = "whsec_"
CACHE_S = 30.0  # a revoked key works at most this much longer in a running API


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_webhook_secret() -> str:
    """A 256-bit random webhook secret."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def add_key(session: Session, tenant: str) -> tuple[int, str]:
    """(id, key) of a new key of `tenant`; the key is not stored and cannot be shown again.
    The key gets a webhook secret of its own (`webhook_secret`)."""
    if not tenant or len(tenant) > 128:
        raise ValueError("a tenant is a non-empty name of at most 128 characters")
    key = PREFIX + secrets.token_urlsafe(32)
    row = models.ApiKey(tenant=tenant, key_hash=key_hash(key), webhook_secret=new_webhook_secret())
    session.add(row)
    session.flush()
    return row.id, key


def webhook_secret(session: Session, key_id: int) -> str | None:
    """The webhook secret of key `key_id` (None: no such key)."""
    return session.scalar(select(models.ApiKey.webhook_secret).where(models.ApiKey.id == key_id))


def rotate_webhook_secret(session: Session, key_id: int) -> str | None:
    """Replace the key's webhook secret with a new one and return it (None: no such key).
    Every callback signed from now on, retries of earlier ones included, uses the new one."""
    secret = new_webhook_secret()
    done = session.scalar(
        update(models.ApiKey)
        .where(models.ApiKey.id == key_id)
        .values(webhook_secret=secret)
        .returning(models.ApiKey.id)
    )
    return secret if done is not None else None


def revoke_key(session: Session, key_id: int) -> bool:
    done = session.scalar(
        update(models.ApiKey)
        .where(models.ApiKey.id == key_id, models.ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
        .returning(models.ApiKey.id)
    )
    return done is not None


class KeyCache:
    """Tenant (and id) of a key hash, from the database at most every CACHE_S per key (a
    request with a known key touches no database connection to authenticate)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key hash -> (tenant, key id, expiry); (None, None, expiry) for an unknown key
        self._known: dict[str, tuple[str | None, int | None, float]] = {}
        self._loading: dict[str, asyncio.Future[str | None]] = {}

    async def lookup(self, database_url: str, key: str) -> str | None:
        """`tenant()` for the event loop: a known key costs one SHA-256 and no thread, and
        concurrent requests with a key not known yet share one database query (200
        clients starting at once would otherwise each take a thread and a connection)."""
        known, tenant = self.cached(key)
        if known:
            return tenant
        loading = self._loading.get(key)
        if loading is None:
            loading = asyncio.ensure_future(run_in_threadpool(self.tenant, database_url, key))
            self._loading[key] = loading
            loading.add_done_callback(lambda _: self._loading.pop(key, None))
        return await asyncio.shield(loading)

    def cached(self, key: str) -> tuple[bool, str | None]:
        """(known, tenant) without the database."""
        with self._lock:
            hit = self._known.get(key_hash(key))
        if hit is not None and hit[2] > time.monotonic():
            return True, hit[0]
        return False, None

    def key_id(self, key: str) -> int | None:
        """The id of a key `lookup` or `tenant` accepted (whose secret signs its callbacks)."""
        with self._lock:
            hit = self._known.get(key_hash(key))
        return hit[1] if hit is not None else None

    def tenant(self, database_url: str, key: str) -> str | None:
        known, tenant = self.cached(key)
        if known:
            return tenant
        digest, now = key_hash(key), time.monotonic()
        with session_scope(database_url) as session:
            row = session.execute(
                select(models.ApiKey.tenant, models.ApiKey.id).where(
                    models.ApiKey.key_hash == digest, models.ApiKey.revoked_at.is_(None)
                )
            ).one_or_none()
        tenant, key_id = (row.tenant, row.id) if row is not None else (None, None)
        with self._lock:
            if len(self._known) > 100_000:
                self._known.clear()
            self._known[digest] = (tenant, key_id, now + CACHE_S)
        return tenant
