"""How failures read: one line per failure, for the database's `reason` and the console.

Exit codes of every `ocrfleet` command (documented in the README and `ocrfleet --help`)."""

from __future__ import annotations

import re
from typing import Any

EXIT_OK = 0  # every input done
EXIT_FAILED = 1  # some input rejected, or some document or page failed
EXIT_USAGE = 2  # usage or configuration error: nothing was processed
EXIT_INTERNAL = 3  # an internal error of ocrfleet itself (the traceback is in the log)


class ConfigError(ValueError):
    """A setting that cannot work (a store URL of no known scheme, ...): exit code 2."""


def describe(exc: BaseException) -> str:
    """`ExcClass: first line of the message`, at most 1000 characters: a row's `reason`.
    A message that is itself a traceback (onnxruntime wrappers do that) gives its last
    line, the error it ends with."""
    text = [line for line in str(exc).strip().splitlines() if line.strip()]
    line = text[0] if text else ""
    if line.startswith("Traceback (most recent call last)"):
        line = text[-1].strip()
    return f"{type(exc).__name__}: {line}"[:1000]


_STORE_URI = re.compile(r"\b(?:s3|file)://\S*[^\s:;,.)]")


def public_reason(reason: str | None) -> str | None:
    """A reason as a tenant may read it (the API, webhooks, every output format): store
    URIs (the fleet's bucket, prefix and keys, or a worker's paths) replaced by
    `<store object>`; the rest, the error's kind and what went wrong, as stored."""
    return _STORE_URI.sub("<store object>", reason) if reason else reason


def caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `exc` or anything in its chain of causes is a `kind` (a library that wraps
    a time-limit signal in its own exception still timed out)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


_SECRET_WORDS = ("SECRET", "PASSWORD", "AUTH", "TOKEN", "KEY")
_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@/]*@")


def settings_error(exc: Any, prefix: str = "OCRFLEET_") -> str:
    """A pydantic ValidationError of `Settings` as one line naming each bad variable."""
    parts = []
    for error in exc.errors():
        name = prefix + "_".join(str(part) for part in error["loc"][:1]).upper()
        raw = error.get("input")
        secret = any(word in name for word in _SECRET_WORDS)  # never echo a secret back
        value = _URL_PASSWORD.sub(r"\1***@", str(raw))  # nor a password in a URL
        shown = "" if isinstance(raw, dict) or secret else f" (got {value[:60]!r})"
        message = str(error["msg"]).removeprefix("Value error, ")  # a validator's own words
        parts.append(f"{name}: {message}{shown}")
    return "; ".join(parts) or describe(exc)


def is_transient(exc: BaseException) -> bool:
    """Whether trying again later can help: throttling, 5xx, a lost connection."""
    import kombu.exceptions
    import redis.exceptions
    from sqlalchemy import exc as sa_exc

    from ocrfleet.storage.base import StorageError

    if isinstance(exc, StorageError):
        return not exc.permanent
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(
        exc,
        sa_exc.OperationalError
        | sa_exc.InterfaceError
        | sa_exc.TimeoutError
        | redis.exceptions.ConnectionError
        | redis.exceptions.TimeoutError
        | kombu.exceptions.OperationalError
        | ConnectionError
        | TimeoutError,
    )
