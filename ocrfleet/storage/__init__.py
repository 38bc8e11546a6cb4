"""The object store: `open_store()` picks the backend from the URL's scheme.

`file://` is the embedded default (a directory), `s3://bucket/prefix` the fleet's store.
Messages carry URIs from `store.uri()`/`put()`; `read_uri()` reads any of them back.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocrfleet.config import Settings
from ocrfleet.errors import ConfigError
from ocrfleet.storage.base import (
    AccessDenied,
    InvalidKey,
    ObjectNotFound,
    ObjectStore,
    StorageError,
    TransientStorageError,
)
from ocrfleet.storage.keys import join_key, validate_key, validate_prefix
from ocrfleet.storage.local import LocalStore, file_uri_to_path
from ocrfleet.storage.s3_uris import parse_s3_uri
from ocrfleet.storage.sources import SourceRefused, fleet_may_read

if TYPE_CHECKING:
    from ocrfleet.storage.s3 import S3Store

__all__ = [
    "AccessDenied",
    "InvalidKey",
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "S3Store",
    "SourceRefused",
    "StorageError",
    "TransientStorageError",
    "join_key",
    "open_store",
    "read_uri",
    "validate_key",
    "validate_prefix",
]


def __getattr__(name: str) -> Any:
    """`S3Store` is imported on first use: boto3 costs ~11 MB in a process on a local store."""
    if name == "S3Store":
        from ocrfleet.storage.s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _s3_store(url: str, settings: Settings) -> S3Store:
    from ocrfleet.storage.s3 import S3Store

    return S3Store(url, settings)


def open_store(settings: Settings, url: str | None = None) -> ObjectStore:
    """The store at `url` (default `settings.store_url`). Open once and reuse: S3 stores keep
    their client."""
    url = settings.store_url if url is None else url
    if url.startswith("file://"):
        return LocalStore(url)
    if url.startswith("s3://"):
        return _s3_store(url, settings)
    raise ConfigError(
        f"unsupported store URL {url!r}: use file://./dir, file:///abs/dir or s3://bucket/prefix"
    )


_bucket_stores: dict[tuple[str, str | None, str, int], S3Store] = {}
_bucket_stores_lock = threading.Lock()


def _bucket_store(bucket: str, settings: Settings) -> S3Store:
    """One cached store (hence one client) per bucket and S3 settings, for read_uri."""
    cache_key = (bucket, settings.s3_endpoint_url, settings.s3_region, settings.s3_max_attempts)
    with _bucket_stores_lock:
        store = _bucket_stores.get(cache_key)
        if store is None:
            store = _bucket_stores[cache_key] = _s3_store(f"s3://{bucket}", settings)
        return store


def read_uri(uri: str, settings: Settings) -> bytes:
    """Bytes behind `s3://bucket/key`, `file://...` or a plain local path.

    An `s3://` object outside the store, the intake prefix and `OCRFLEET_SOURCE_ALLOW` is
    refused (`SourceRefused`) before any request: the fleet's credentials read only where
    the operator pointed them (`ocrfleet.storage.sources`). Local paths are read as given
    (no store root applies): whoever can enqueue a URI can make a worker read any file that
    worker may read, so the HTTP API takes `s3://` URIs only, confined to the tenant's.
    """
    if uri.startswith("s3://"):
        if not fleet_may_read(uri, settings):
            raise SourceRefused(
                f"read {uri[:200]}: not in the store, the intake prefix or OCRFLEET_SOURCE_ALLOW"
            )
        bucket, key = parse_s3_uri(uri)
        return _bucket_store(bucket, settings).get(key)
    if uri.startswith("file://"):
        path = file_uri_to_path(uri)
    elif "://" in uri:
        raise ValueError(f"unsupported URI scheme in {uri!r}: use s3://, file:// or a path")
    else:
        if not uri or "\x00" in uri:
            raise InvalidKey(f"not a usable path: {uri!r}")
        path = Path(uri)
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise ObjectNotFound(f"read {uri}: no such file") from exc
    except PermissionError as exc:
        raise AccessDenied(f"read {uri}: permission denied") from exc
    except OSError as exc:
        raise StorageError(f"read {uri}: {exc}") from exc
