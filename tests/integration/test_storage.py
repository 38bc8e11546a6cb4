"""The object store contract, run unchanged against the local directory and moto's S3 server,
plus S3 failure handling against real HTTP endpoints (moto, and a fault-injecting proxy)."""

from __future__ import annotations

import http.client
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest

from ocrfleet.config import Settings
from ocrfleet.storage import (
    AccessDenied,
    InvalidKey,
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    S3Store,
    StorageError,
    TransientStorageError,
    open_store,
    read_uri,
)
from ocrfleet.storage.local import TEMP_PREFIX
from tests.conftest import free_port
from tests.unit.test_storage_keys import BAD_KEYS

pytestmark = pytest.mark.integration

BINARY = bytes(range(256)) * 4099 + b"\x00\xff\r\n"  # ~1 MiB, every byte value, no text


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[ObjectStore, Settings]:
    """The same store contract on a tmp directory and on moto's S3 server (with a prefix)."""
    if request.param == "local":
        settings = Settings(store_url=f"file://{tmp_path / 'store'}")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        settings = Settings(
            store_url=f"s3://{bucket}/tenant/run",
            s3_endpoint_url=request.getfixturevalue("moto_endpoint"),
        )
    return open_store(settings), settings


@pytest.fixture
def store(backend: tuple[ObjectStore, Settings]) -> ObjectStore:
    return backend[0]


@pytest.mark.parametrize("data", [b"", b"x", BINARY], ids=["empty", "one-byte", "1MiB-binary"])
def test_put_get_roundtrip(backend: tuple[ObjectStore, Settings], data: bytes) -> None:
    store, settings = backend
    uri = store.put("docs/abc/p0001.png", data, content_type="image/png")
    assert uri == store.uri("docs/abc/p0001.png")
    assert store.get("docs/abc/p0001.png") == data
    assert read_uri(uri, settings) == data


def test_overwrite_replaces_content(store: ObjectStore) -> None:
    store.put("k", BINARY)
    store.put("k", b"short")
    assert store.get("k") == b"short"
    assert store.list() == ["k"]


def test_exists_and_delete(store: ObjectStore) -> None:
    assert not store.exists("a/b")
    store.put("a/b", b"1")
    assert store.exists("a/b")
    assert not store.exists("a")  # a key's parent is not an object
    store.delete("a/b")
    assert not store.exists("a/b")
    with pytest.raises(ObjectNotFound):
        store.get("a/b")
    store.delete("a/b")  # deleting twice is fine: tasks are redelivered


def test_list_with_prefix(store: ObjectStore) -> None:
    assert store.list() == []
    keys = ["a/1", "a/2", "a/b/3", "a-x", "ab", "b/1", "ü/文"]
    for key in reversed(keys):
        store.put(key, key.encode())
    assert store.list() == sorted(keys)
    assert store.list("a/") == ["a/1", "a/2", "a/b/3"]
    assert store.list("a") == ["a-x", "a/1", "a/2", "a/b/3", "ab"]
    assert store.list("a/b") == ["a/b/3"]
    assert store.list("a/b/") == ["a/b/3"]
    assert store.list("ü/") == ["ü/文"]
    assert store.list("zzz") == []
    assert store.list("nope/") == []


@pytest.mark.parametrize("prefix", ["../", "/a", "a//", "a/../"])
def test_list_rejects_bad_prefix(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(InvalidKey):
        store.list(prefix)


def test_sibling_store_is_separate(backend: tuple[ObjectStore, Settings]) -> None:
    store, settings = backend
    sibling = open_store(settings, store.url + "-other")
    sibling.put("x", b"sibling")
    store.put("y", b"mine")
    assert store.list() == ["y"]
    assert sibling.list() == ["x"]
    assert not store.exists("x")
    with pytest.raises(InvalidKey):
        store.key_of(sibling.uri("x"))


@pytest.mark.parametrize("key", ["p0001.png", "dir with space/ü 文字 #1?%.png", "..x/.y"])
def test_uri_key_of_roundtrip(store: ObjectStore, key: str) -> None:
    uri = store.put(key, b"v")
    assert store.key_of(uri) == key
    assert store.key_of(store.uri(key)) == key
    assert store.list() == [key]


def test_key_of_rejects_foreign_uris(store: ObjectStore) -> None:
    for uri in [
        store.url,
        store.url + "/",
        store.url + "/../x",
        store.url + "//x",
        "s3://some-other-bucket/x",
        "file:///etc/passwd",
        "https://example.com/x",
    ]:
        with pytest.raises(InvalidKey):
            store.key_of(uri)


def test_missing_key_is_object_not_found(backend: tuple[ObjectStore, Settings]) -> None:
    store, settings = backend
    with pytest.raises(ObjectNotFound) as info:
        store.get("never/written")
    assert info.value.permanent
    with pytest.raises(ObjectNotFound):
        read_uri(store.uri("never/written"), settings)


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_invalid_keys_rejected_everywhere(store: ObjectStore, key: str) -> None:
    for operation in (
        lambda: store.put(key, b"x"),
        lambda: store.get(key),
        lambda: store.exists(key),
        lambda: store.delete(key),
        lambda: store.uri(key),
    ):
        with pytest.raises(InvalidKey):
            operation()
    assert store.list() == []


# -- local directory specifics ----------------------------------------------------------


@pytest.fixture
def local(tmp_path: Path) -> LocalStore:
    store = open_store(Settings(), f"file://{tmp_path / 'store'}")
    assert isinstance(store, LocalStore)
    return store


def test_local_symlink_escape_rejected(local: LocalStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    local.put("inside.txt", b"inside")
    (local.root / "dirlink").symlink_to(outside, target_is_directory=True)
    (local.root / "filelink").symlink_to(outside / "secret.txt")
    (local.root / "alias").symlink_to(local.root / "inside.txt")  # stays inside: allowed

    for key in ["dirlink/secret.txt", "filelink"]:
        with pytest.raises(InvalidKey, match="outside the store root"):
            local.get(key)
        with pytest.raises(InvalidKey):
            local.exists(key)
    with pytest.raises(InvalidKey):
        local.put("dirlink/new.txt", b"x")
    with pytest.raises(InvalidKey):
        local.put("dirlink/deeper/new.txt", b"x")
    with pytest.raises(InvalidKey):
        local.delete("filelink")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_bytes() == b"secret"
    assert local.get("alias") == b"inside"
    assert local.list() == ["alias", "inside.txt"]
    assert local.list("dirlink/") == []


def test_local_root_through_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    store = open_store(Settings(), f"file://{tmp_path / 'link'}")
    store.put("k", b"v")
    assert (tmp_path / "real" / "k").read_bytes() == b"v"
    assert store.key_of((tmp_path / "link" / "k").as_uri()) == "k"
    assert store.key_of(store.uri("k")) == "k"


def test_local_writes_leave_no_temp_files_and_reserve_their_names(local: LocalStore) -> None:
    for i in range(5):
        local.put(f"d/{i}", BINARY[: i * 1000])
    leftovers = [p for p in local.root.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    assert leftovers == []
    with pytest.raises(InvalidKey):
        local.put(f"d/{TEMP_PREFIX}x", b"x")
    (local.root / "d" / f"{TEMP_PREFIX}crashed").write_bytes(b"half")  # a crash leftover
    assert local.list("d/") == [f"d/{i}" for i in range(5)]


def test_local_readers_never_see_partial_writes(local: LocalStore) -> None:
    payloads = [b"A" * 2_000_000, b"B" * 1_000_000]
    local.put("hot", payloads[0])
    stop = threading.Event()
    seen: set[int] = set()
    bad: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            data = local.get("hot")
            seen.add(len(data))
            if data not in payloads:
                bad.append(len(data))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(60):
            local.put("hot", payloads[i % 2])
    finally:
        stop.set()
        thread.join()
    assert bad == []
    assert seen <= {len(p) for p in payloads}


def test_local_key_parent_conflict_is_a_clear_error(local: LocalStore) -> None:
    local.put("a", b"file")
    with pytest.raises(StorageError, match="parent segment"):
        local.put("a/b", b"x")
    local.put("c/d", b"x")
    with pytest.raises(StorageError, match="directory"):
        local.put("c", b"x")


# -- S3 failure handling against real HTTP endpoints ------------------------------------

SLOWDOWN = (503, "SlowDown", "Please reduce your request rate.")
INTERNAL = (500, "InternalError", "We encountered an internal error. Please try again.")
THROTTLED = (429, "TooManyRequestsException", "Too many requests.")


class FaultProxy:
    """An HTTP server on 127.0.0.1 in front of moto: it counts every request, answers the
    next scripted faults itself (an S3 error, or 'drop' = close without answering), and
    forwards everything else to moto unchanged."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.faults: list[tuple[int, str, str] | str] = []
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _take(self, method: str, path: str) -> tuple[int, str, str] | str | None:
        with self.lock:
            self.requests.append((method, path))
            return self.faults.pop(0) if self.faults else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        hop_by_hop = {"connection", "keep-alive", "transfer-encoding", "expect", "content-length"}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take(self.command, self.path)
                if fault == "drop":
                    self.close_connection = True
                    return
                if fault is not None:
                    status, code, message = fault
                    payload = (
                        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                        f"<Message>{message}</Message></Error>"
                    ).encode()
                    self.send_response_only(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in hop_by_hop}
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    self.send_response_only(response.status)
                    for k, v in response.getheaders():
                        if k.lower() not in hop_by_hop:
                            self.send_header(k, v)
                    if self.command == "HEAD":
                        self.send_header(
                            "Content-Length", response.getheader("Content-Length", "0")
                        )
                    else:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_one

        return Handler


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    server = FaultProxy(moto_endpoint)
    try:
        yield server
    finally:
        server.close()


def proxied_store(proxy: FaultProxy, bucket: str, max_attempts: int) -> S3Store:
    settings = Settings(s3_endpoint_url=proxy.url, s3_max_attempts=max_attempts)
    return S3Store(f"s3://{bucket}/p", settings, backoff_base=0.001, backoff_cap=0.01)


OPERATIONS = {
    "get": lambda s: s.get("obj"),
    "put": lambda s: s.put("obj", b"new"),
    "exists": lambda s: s.exists("obj"),
    "list": lambda s: s.list(),
    "delete": lambda s: s.delete("obj"),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize(
    "fault", [SLOWDOWN, INTERNAL, THROTTLED, "drop"], ids=["503-SlowDown", "500", "429", "drop"]
)
def test_s3_transient_faults_are_retried_then_succeed(
    proxy: FaultProxy, s3_bucket: str, operation: str, fault: tuple[int, str, str] | str
) -> None:
    store = proxied_store(proxy, s3_bucket, max_attempts=4)
    store.put("obj", b"old")
    proxy.requests.clear()
    proxy.faults = [fault] * 3
    OPERATIONS[operation](store)
    assert len(proxy.requests) == 4, proxy.requests  # 3 faults + the one that got through
    assert len({path for _, path in proxy.requests}) == 1  # the same request, repeated


@pytest.mark.parametrize("max_attempts", [1, 3])
@pytest.mark.parametrize("operation", ["get", "put"])
def test_s3_gives_up_after_exactly_max_attempts(
    proxy: FaultProxy, s3_bucket: str, max_attempts: int, operation: str
) -> None:
    store = proxied_store(proxy, s3_bucket, max_attempts=max_attempts)
    store.put("obj", b"old")
    proxy.requests.clear()
    proxy.faults = [SLOWDOWN] * 10
    with pytest.raises(TransientStorageError, match="SlowDown") as info:
        OPERATIONS[operation](store)
    assert info.value.permanent is False
    assert info.value.attempts == max_attempts
    # botocore's own retries are off: every attempt the server saw is one of ours.
    assert len(proxy.requests) == max_attempts


@pytest.mark.parametrize("operation", ["get", "put"])
def test_s3_access_denied_fails_at_once(
    proxy: FaultProxy, s3_bucket: str, moto_endpoint: str, operation: str
) -> None:
    store = proxied_store(proxy, s3_bucket, max_attempts=5)
    store.put("obj", b"old")
    deny = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": f"arn:aws:s3:::{s3_bucket}/p/*",
            }
        ],
    }
    admin = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    admin.put_bucket_policy(Bucket=s3_bucket, Policy=json.dumps(deny))
    proxy.requests.clear()
    with pytest.raises(AccessDenied) as info:
        OPERATIONS[operation](store)
    assert info.value.permanent is True
    assert len(proxy.requests) == 1, proxy.requests
    admin.delete_bucket_policy(Bucket=s3_bucket)
    assert store.get("obj") == b"old"  # the same store works once the policy is gone


def test_s3_missing_key_fails_at_once(proxy: FaultProxy, s3_bucket: str) -> None:
    store = proxied_store(proxy, s3_bucket, max_attempts=5)
    with pytest.raises(ObjectNotFound):
        store.get("missing")
    assert not store.exists("missing")
    assert len(proxy.requests) == 2


def test_s3_missing_bucket_is_permanent(moto_endpoint: str, s3_bucket: str) -> None:
    settings = Settings(s3_endpoint_url=moto_endpoint, s3_max_attempts=5)
    store = open_store(settings, f"s3://{s3_bucket}-does-not-exist/p")
    with pytest.raises(StorageError, match="bucket does not exist") as info:
        store.get("k")
    assert info.value.permanent is True
    assert not isinstance(info.value, TransientStorageError)


def test_s3_connection_refused_is_transient(s3_bucket: str) -> None:
    settings = Settings(s3_endpoint_url=f"http://127.0.0.1:{free_port()}", s3_max_attempts=2)
    store = S3Store(f"s3://{s3_bucket}", settings, backoff_base=0.001, connect_timeout=2)
    with pytest.raises(TransientStorageError) as info:
        store.get("k")
    assert info.value.attempts == 2


def test_s3_client_is_reused(proxy: FaultProxy, s3_bucket: str) -> None:
    store = proxied_store(proxy, s3_bucket, max_attempts=1)
    store.put("a", b"1")
    client = store._client()
    store.get("a")
    store.list()
    assert store._client() is client
    assert os.getpid() == store._client_pid
