"""Key rules and store URL parsing: pure functions, no services."""

from __future__ import annotations

from pathlib import Path

import pytest

from ocrfleet.config import Settings
from ocrfleet.storage import (
    AccessDenied,
    InvalidKey,
    LocalStore,
    ObjectNotFound,
    S3Store,
    StorageError,
    TransientStorageError,
    join_key,
    open_store,
    read_uri,
    validate_key,
    validate_prefix,
)

GOOD_KEYS = [
    "a",
    "a/b/c.png",
    "derived/0123abcd/p0001.png",
    "ünïcödé/文字.txt",
    "with space/and#hash?and%percent",
    ".hidden",
    "..x",
    "a..b/...",
    "x" * 1024,
    "é" * 512,  # exactly 1024 bytes of UTF-8
]

BAD_KEYS = [
    "",
    ".",
    "..",
    "../x",
    "a/../b",
    "a/..",
    "./a",
    "a/./b",
    "a/.",
    "/abs",
    "/",
    "a//b",
    "a/",
    "//a",
    "a\\b",
    "..\\x",
    "a\x00b",
    "a\nb",
    "a\tb",
    "a\x1fb",
    "a\x7fb",
    "x" * 1025,
    "é" * 513,  # 1026 bytes
    "\udc80bad-surrogate",
]


@pytest.mark.parametrize("key", GOOD_KEYS)
def test_good_keys_pass_unchanged(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_bad_keys_rejected(key: str) -> None:
    with pytest.raises(InvalidKey) as info:
        validate_key(key)
    assert str(info.value)  # says why


def test_non_string_key_rejected() -> None:
    with pytest.raises(InvalidKey, match="must be a str"):
        validate_key(b"a")  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", ["", "a", "a/", "a/b", "a/b/", "a/.", "a/..x", "ü"])
def test_good_prefixes(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["/a", "/", "../", "a//", "a/../b/", "./", "a\x00", "a\\b"])
def test_bad_prefixes(prefix: str) -> None:
    with pytest.raises(InvalidKey):
        validate_prefix(prefix)


def test_join_key_validates() -> None:
    assert join_key("derived", "abc", "p0001.png") == "derived/abc/p0001.png"
    with pytest.raises(InvalidKey):
        join_key("derived", "..", "x")
    with pytest.raises(InvalidKey):
        join_key("derived", "", "x")


def test_error_classes_say_whether_to_retry() -> None:
    assert ObjectNotFound.permanent and AccessDenied.permanent and InvalidKey.permanent
    assert StorageError.permanent
    assert TransientStorageError("x").permanent is False
    assert issubclass(InvalidKey, ValueError) and issubclass(InvalidKey, StorageError)
    for cls in (ObjectNotFound, AccessDenied, TransientStorageError, InvalidKey):
        assert issubclass(cls, StorageError)


def test_open_store_absolute_file_url(tmp_path: Path) -> None:
    store = open_store(Settings(), f"file://{tmp_path}/store")
    assert isinstance(store, LocalStore)
    assert store.url == (tmp_path / "store").resolve().as_uri()


def test_open_store_relative_file_url_is_relative_to_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(Settings(store_url="file://./ocrfleet-store"))
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "ocrfleet-store").resolve()
    store.put("a/b.bin", b"x")
    assert (tmp_path / "ocrfleet-store" / "a" / "b.bin").read_bytes() == b"x"


def test_open_store_s3_url_is_lazy_and_parses_prefix() -> None:
    settings = Settings(s3_endpoint_url="http://127.0.0.1:9")  # nothing listens; never contacted
    store = open_store(settings, "s3://my-bucket/run/x/")
    assert isinstance(store, S3Store)
    assert store.url == "s3://my-bucket/run/x"
    assert store.uri("a/b.png") == "s3://my-bucket/run/x/a/b.png"
    assert store.key_of("s3://my-bucket/run/x/a/b.png") == "a/b.png"
    assert open_store(settings, "s3://my-bucket").uri("k") == "s3://my-bucket/k"
    assert open_store(settings, "s3://my-bucket/").url == "s3://my-bucket"


@pytest.mark.parametrize(
    "uri",
    ["s3://my-bucket/run/xy/a", "s3://other/run/x/a", "s3://my-bucket/run/x/", "file:///a", "x"],
)
def test_s3_key_of_rejects_foreign_uris(uri: str) -> None:
    store = open_store(Settings(), "s3://my-bucket/run/x")
    with pytest.raises(InvalidKey):
        store.key_of(uri)


def test_s3_prefix_plus_key_over_limit_is_invalid() -> None:
    store = open_store(Settings(), "s3://my-bucket/run")
    validate_key("k" * 1024)
    with pytest.raises(InvalidKey, match="prefix"):
        store.uri("k" * 1024)


@pytest.mark.parametrize(
    "url", ["http://host/x", "ftp://x", "/plain/path", "", "S3://b/x", "s3://", "s3://b//x"]
)
def test_open_store_rejects_unknown_or_broken_urls(url: str) -> None:
    with pytest.raises(ValueError):
        open_store(Settings(), url)


def test_unknown_scheme_error_names_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"file://.*s3://"):
        open_store(Settings(), "gs://bucket/x")


def test_local_uri_is_percent_encoded_and_reversible(tmp_path: Path) -> None:
    store = open_store(Settings(), f"file://{tmp_path}")
    key = "a b/#c%.png"
    uri = store.uri(key)
    assert uri == f"{tmp_path.resolve().as_uri()}/a%20b/%23c%25.png"
    assert store.key_of(uri) == key


def test_read_uri_local_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "in put.pdf").write_bytes(b"%PDF-1.4 bytes")
    settings = Settings()
    target = tmp_path / "d" / "in put.pdf"
    assert read_uri(str(target), settings) == b"%PDF-1.4 bytes"
    assert read_uri(target.as_uri(), settings) == b"%PDF-1.4 bytes"
    monkeypatch.chdir(tmp_path)
    assert read_uri("d/in put.pdf", settings) == b"%PDF-1.4 bytes"
    assert read_uri("file://./d/in%20put.pdf", settings) == b"%PDF-1.4 bytes"


@pytest.mark.parametrize("name", ["missing.pdf", "d"])
def test_read_uri_missing_or_directory_is_not_found(tmp_path: Path, name: str) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(ObjectNotFound):
        read_uri(str(tmp_path / name), Settings())


def test_read_uri_rejects_other_schemes() -> None:
    with pytest.raises(ValueError, match="unsupported URI scheme"):
        read_uri("https://example.com/x.pdf", Settings())
