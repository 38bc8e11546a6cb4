"""S3 (or any S3-compatible endpoint) through boto3, addressed by `s3://bucket/prefix` URIs.

Retries are ours, not botocore's (botocore is held to one attempt), so the attempt budget is
exactly `Settings.s3_max_attempts` and visible in tests: throttling, 5xx and connection
errors back off exponentially with full jitter; 403 and 404 fail at once (retrying a denied
or missing object only burns time, as olmocr learned).
"""

from __future__ import annotations

import builtins
import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from ocrfleet.config import Settings
from ocrfleet.storage.base import (
    AccessDenied,
    InvalidKey,
    ObjectNotFound,
    ObjectStore,
    StorageError,
    TransientStorageError,
)
from ocrfleet.storage.keys import MAX_KEY_BYTES, validate_key, validate_prefix
from ocrfleet.storage.s3_uris import SCHEME, parse_s3_uri

NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
    }
)
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
    }
)
TRANSIENT_CODES = frozenset(
    {"InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeoutException", "503"}
)
_TRANSIENT_EXCEPTIONS = (
    BotoConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ...
    HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
    ConnectionClosedError,
    IncompleteReadError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


def _classify(exc: Exception, what: str) -> StorageError | None:
    """Map a botocore failure to our errors; None for anything that is not botocore's."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = f"{what}: {code or 'error'} (HTTP {status}) {error.get('Message', '')}".rstrip()
        if code == "NoSuchBucket":
            return StorageError(f"{detail}: the bucket does not exist")
        if code in NOT_FOUND_CODES or status == 404:
            return ObjectNotFound(detail)
        if code in DENIED_CODES or status == 403:
            return AccessDenied(detail)
        if (
            code in THROTTLE_CODES
            or code in TRANSIENT_CODES
            or status == 429
            or (isinstance(status, int) and status >= 500 and status != 501)
        ):
            return TransientStorageError(detail)
        return StorageError(detail)
    if isinstance(exc, _TRANSIENT_EXCEPTIONS):
        return TransientStorageError(f"{what}: {exc}")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return StorageError(f"{what}: no usable AWS credentials ({exc})")
    if isinstance(exc, BotoCoreError):
        return StorageError(f"{what}: {exc}")
    return None


class S3Store(ObjectStore):
    """Keys live under `s3://bucket/prefix/`; one boto3 client per store (and per process)."""

    def __init__(
        self,
        url: str,
        settings: Settings,
        *,
        backoff_base: float = 0.25,
        backoff_cap: float = 20.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
    ) -> None:
        bucket, prefix = parse_s3_uri(url)
        prefix = prefix.rstrip("/")
        if prefix:
            try:
                validate_key(prefix)
            except InvalidKey as exc:
                raise ValueError(f"bad prefix in store URL {url!r}: {exc}") from exc
        self._bucket = bucket
        self._prefix = prefix + "/" if prefix else ""
        self._url = f"{SCHEME}{bucket}/{prefix}" if prefix else f"{SCHEME}{bucket}"
        self._endpoint_url = settings.s3_endpoint_url
        self._region = settings.s3_region
        self._max_attempts = settings.s3_max_attempts
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._rng = random.Random()  # private: never disturb the seeded global RNG
        self._lock = threading.Lock()
        self._client_obj: Any = None
        self._client_pid = -1

    @property
    def url(self) -> str:
        return self._url

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def max_attempts(self) -> int:
        return self._max_attempts

    def _client(self) -> Any:
        """Created on first use and again after a fork: connections must not cross processes."""
        with self._lock:
            if self._client_obj is None or self._client_pid != os.getpid():
                config = Config(
                    region_name=self._region,
                    connect_timeout=self._connect_timeout,
                    read_timeout=self._read_timeout,
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    **(
                        {
                            "s3": {"addressing_style": "path"},
                            # MinIO/Ceph versions differ in the newer checksum headers.
                            "request_checksum_calculation": "when_required",
                            "response_checksum_validation": "when_required",
                        }
                        if self._endpoint_url
                        else {}
                    ),
                )
                self._client_obj = boto3.session.Session().client(
                    "s3", endpoint_url=self._endpoint_url, config=config
                )
                self._client_pid = os.getpid()
            return self._client_obj

    def _full_key(self, key: str) -> str:
        full = self._prefix + validate_key(key)
        if len(full.encode("utf-8")) > MAX_KEY_BYTES:
            raise InvalidKey(f"key {key!r} with the store prefix exceeds {MAX_KEY_BYTES} bytes")
        return full

    def _backoff(self, attempt: int) -> float:
        return self._rng.uniform(
            0.0, min(self._backoff_cap, self._backoff_base * 2 ** (attempt - 1))
        )

    def _call(self, what: str, operation: Callable[[], T]) -> T:
        """Run `operation` up to max_attempts times; only transient failures are retried."""
        for attempt in range(1, self._max_attempts + 1):
            try:
                return operation()
            except Exception as exc:
                error = _classify(exc, what)
                if error is None:
                    raise
                if error.permanent:
                    raise error from exc
                if attempt == self._max_attempts:
                    raise TransientStorageError(
                        f"{error} (gave up after {attempt} attempts)", attempts=attempt
                    ) from exc
                delay = self._backoff(attempt)
                log.warning(
                    "%s; attempt %d/%d, retrying in %.2fs",
                    error,
                    attempt,
                    self._max_attempts,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable: max_attempts >= 1")

    def put(self, key: str, data: bytes | BinaryIO, content_type: str | None = None) -> str:
        full = self._full_key(key)
        extra = {"ContentType": content_type} if content_type else {}
        client = self._client()
        start = None if isinstance(data, bytes | bytearray | memoryview) else data.tell()

        def send() -> Any:
            if start is not None:
                data.seek(start)  # type: ignore[union-attr]  # a retry sends it all again
            return client.put_object(Bucket=self._bucket, Key=full, Body=data, **extra)

        self._call(f"put {self.uri(key)}", send)
        return self.uri(key)

    def get(self, key: str) -> bytes:
        full = self._full_key(key)
        client = self._client()

        def fetch() -> bytes:
            body = client.get_object(Bucket=self._bucket, Key=full)["Body"]
            try:
                return body.read()  # inside the retry: a stream cut mid-way is retried too
            finally:
                body.close()

        return self._call(f"get {self.uri(key)}", fetch)

    def exists(self, key: str) -> bool:
        full = self._full_key(key)
        client = self._client()
        try:
            self._call(
                f"head {self.uri(key)}", lambda: client.head_object(Bucket=self._bucket, Key=full)
            )
        except ObjectNotFound:
            return False
        return True

    def delete(self, key: str) -> None:
        full = self._full_key(key)
        client = self._client()
        self._call(
            f"delete {self.uri(key)}",
            lambda: client.delete_object(Bucket=self._bucket, Key=full),
        )

    def list(self, prefix: str = "") -> builtins.list[str]:
        validate_prefix(prefix)
        client = self._client()
        request: dict[str, str] = {"Bucket": self._bucket, "Prefix": self._prefix + prefix}
        keys: builtins.list[str] = []
        while True:
            page = self._call(
                f"list {self._url}/{prefix}", functools.partial(client.list_objects_v2, **request)
            )
            for item in page.get("Contents", []):
                key = item["Key"][len(self._prefix) :]
                try:
                    keys.append(validate_key(key))
                except InvalidKey:
                    log.warning("skipping object with an invalid key: %s%s", self._prefix, key)
            if not page.get("IsTruncated"):
                return sorted(keys)
            request["ContinuationToken"] = page["NextContinuationToken"]

    def uri(self, key: str) -> str:
        return f"{SCHEME}{self._bucket}/{self._full_key(key)}"

    def key_of(self, uri: str) -> str:
        try:
            bucket, full = parse_s3_uri(uri)
        except ValueError as exc:
            raise InvalidKey(f"{uri!r} is not inside {self._url}: {exc}") from exc
        if bucket != self._bucket or not full.startswith(self._prefix):
            raise InvalidKey(f"{uri!r} is not inside {self._url}")
        return validate_key(full[len(self._prefix) :])
