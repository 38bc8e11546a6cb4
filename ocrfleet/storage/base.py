"""The object-store contract every backend honours, and the errors callers act on.

Errors say whether retrying can help (`permanent`), so a Celery task can put
`TransientStorageError` in `autoretry_for` and fail at once on everything else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import BinaryIO


class StorageError(Exception):
    """Anything the store could not do. Unknown failures are not worth retrying."""

    permanent: bool = True


class ObjectNotFound(StorageError):
    """The key (or file) does not exist."""

    permanent = True


class AccessDenied(StorageError):
    """The credentials may not do this (HTTP 403, file permissions); retrying cannot help."""

    permanent = True


class TransientStorageError(StorageError):
    """Throttling, 5xx or connection trouble that outlasted the store's own retries."""

    permanent = False

    def __init__(self, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class InvalidKey(StorageError, ValueError):
    """A key (or URI) that must never reach the backend: unsafe, malformed or foreign."""

    permanent = True


class ObjectStore(ABC):
    """Flat key -> bytes storage. Keys are validated by `ocrfleet.storage.keys`."""

    @property
    @abstractmethod
    def url(self) -> str:
        """The store's root URI; `open_store(settings, store.url)` opens the same store."""

    @abstractmethod
    def put(self, key: str, data: bytes | BinaryIO, content_type: str | None = None) -> str:
        """Write (or overwrite) one object atomically; returns its full URI. `data` may be
        a seekable binary file, streamed from where it is (uploads never sit in memory)."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; ObjectNotFound if it does not exist."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the object exists."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error (idempotent)."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys that start with `prefix` (plain string prefix, as S3), sorted."""

    @abstractmethod
    def uri(self, key: str) -> str:
        """The full URI of `key` in this store."""

    @abstractmethod
    def key_of(self, uri: str) -> str:
        """Inverse of `uri()`; InvalidKey if `uri` is not inside this store."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
