"""API keys: one tenant each, only the key's SHA-256 in the database, the key itself shown
once by `ocrfleet keys add`. Keys are 256-bit random, so a plain hash is enough (no
salt or slow hash: nothing to guess)."""

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
CACHE_S = 30.0  # a revoked key works at most this much longer in a running API


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def add_key(session: Session, tenant: str) -> tuple[int, str]:
    """(id, key) of a new key of `tenant`; the key is not stored and cannot be shown again."""
    if not tenant or len(tenant) > 128:
        raise ValueError("a tenant is a non-empty name of at most 128 characters")
    key = PREFIX + secrets.token_urlsafe(32)
    row = models.ApiKey(tenant=tenant, key_hash=key_hash(key))
    session.add(row)
    session.flush()
    return row.id, key


def revoke_key(session: Session, key_id: int) -> bool:
    done = session.scalar(
        update(models.ApiKey)
        .where(models.ApiKey.id == key_id, models.ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
        .returning(models.ApiKey.id)
    )
    return done is not None


class KeyCache:
    """Tenant of a key hash, from the database at most every CACHE_S per key (a request
    with a known key touches no database connection to authenticate)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, tuple[str | None, float]] = {}
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
        if hit is not None and hit[1] > time.monotonic():
            return True, hit[0]
        return False, None

    def tenant(self, database_url: str, key: str) -> str | None:
        known, tenant = self.cached(key)
        if known:
            return tenant
        digest, now = key_hash(key), time.monotonic()
        with session_scope(database_url) as session:
            tenant = session.scalar(
                select(models.ApiKey.tenant).where(
                    models.ApiKey.key_hash == digest, models.ApiKey.revoked_at.is_(None)
                )
            )
        with self._lock:
            if len(self._known) > 100_000:
                self._known.clear()
            self._known[digest] = (tenant, now + CACHE_S)
        return tenant
