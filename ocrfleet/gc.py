"""`ocrfleet gc`: store objects that no database row references.

Page images live under `derived/` (named by input sha256, DPI and page number, shared by
every run of the same input) and uploads under `intake/`; a page row references its image
by `image_uri` and a document its upload by `source_uri`. Anything else under those two
prefixes is left over: a crash between writing images and committing their rows, or rows
deleted by hand. Nothing outside the two prefixes is ever touched, nor tenants' own objects
under `intake/<tenant>/` (`ocrfleet.storage.sources`), which are theirs, not the fleet's.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from ocrfleet.config import Settings
from ocrfleet.db import models
from ocrfleet.db.session import session_scope
from ocrfleet.storage import InvalidKey, ObjectStore, open_store

PREFIXES = ("derived/", "intake/")


@dataclass(frozen=True)
class Garbage:
    keys: list[str]  # unreferenced keys, deleted when asked
    kept: int  # referenced keys under the prefixes


def referenced_keys(settings: Settings, store: ObjectStore) -> set[str]:
    """Keys of this store named by any page's image or any document's source."""
    keys = set()
    with session_scope(settings.database_url) as session:
        uris = list(session.scalars(select(models.Page.image_uri)))
        uris += list(session.scalars(select(models.Document.source_uri)))
    for uri in uris:
        try:
            keys.add(store.key_of(uri))
        except (InvalidKey, ValueError):
            continue  # a local path or another store's URI
    return keys


def _tenants(key: str) -> bool:
    """Whether `key` is a tenant's object (`intake/<tenant>/...`), not an upload."""
    return key.startswith("intake/") and "/" in key.removeprefix("intake/")


def collect_garbage(settings: Settings, *, delete: bool = False) -> Garbage:
    """The unreferenced objects under `PREFIXES`; with `delete`, removes them too. Run it
    while nothing ingests: images are written before the rows that reference them."""
    store = open_store(settings)
    used = referenced_keys(settings, store)
    keys = [key for prefix in PREFIXES for key in store.list(prefix) if not _tenants(key)]
    unused = [key for key in keys if key not in used]
    if delete:
        for key in unused:
            store.delete(key)
    return Garbage(keys=unused, kept=len(keys) - len(unused))
