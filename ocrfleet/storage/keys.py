"""Key rules shared by every backend, so a key valid on S3 is valid on disk and vice versa.

A key is a relative, `/`-separated path: non-empty, at most 1024 bytes of UTF-8 (S3's
limit), no empty, `.` or `..` segments, no backslash, no control characters. These rules
stop traversal before a key gets near a filesystem; the local backend still checks the
resolved path (symlinks) on top.
"""

from __future__ import annotations

from ocrfleet.storage.base import InvalidKey

MAX_KEY_BYTES = 1024


def _bad_char(text: str) -> str | None:
    for char in text:
        if char == "\\":
            return "a backslash"
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"control character {char!r}"
    return None


def _check_length(text: str, what: str) -> None:
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidKey(f"{what} is not encodable as UTF-8: {text[:60]!r}") from exc
    if size > MAX_KEY_BYTES:
        raise InvalidKey(f"{what} is {size} bytes of UTF-8, over {MAX_KEY_BYTES}: {text[:60]!r}...")


def validate_key(key: str) -> str:
    """Return `key` unchanged if it is safe to use, else raise InvalidKey saying why."""
    if not isinstance(key, str):
        raise InvalidKey(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKey("key must not be empty")
    _check_length(key, "key")
    bad = _bad_char(key)
    if bad:
        raise InvalidKey(f"key contains {bad}: {key!r}")
    if key.startswith("/"):
        raise InvalidKey(f"key must be relative, not start with '/': {key!r}")
    for segment in key.split("/"):
        if segment == "":
            raise InvalidKey(f"key has an empty segment ('//' or trailing '/'): {key!r}")
        if segment in (".", ".."):
            raise InvalidKey(f"key has a {segment!r} segment: {key!r}")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix: '' or a key's beginning. Whole segments follow key rules; the last,
    partial one may be anything without control characters (it is only string-matched)."""
    if not isinstance(prefix, str):
        raise InvalidKey(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix:
        return prefix
    if prefix.startswith("/"):
        raise InvalidKey(f"prefix must be relative, not start with '/': {prefix!r}")
    head, _, partial = prefix.rpartition("/")
    if head:
        validate_key(head)
    bad = _bad_char(partial)
    if bad:
        raise InvalidKey(f"prefix contains {bad}: {prefix!r}")
    _check_length(prefix, "prefix")
    return prefix


def join_key(*parts: str) -> str:
    """Join key parts with '/', validating the result (e.g. `join_key("derived", sha, name)`)."""
    return validate_key("/".join(parts))
