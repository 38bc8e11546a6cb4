"""What the API accepts from a request, checked before it reaches the database or the
fleet: a malformed value is a 422 with one line saying which and why, never a 500 from
PostgreSQL (a NUL byte, an id past BIGINT), the JSON parser (nesting past the recursion
limit, a 5,000-digit number) or an encoder (NaN)."""

from __future__ import annotations

import json
from typing import Any

# Ids are BIGINT: a larger number names no document and PostgreSQL refuses to compare it.
MAX_ID = 2**63 - 1
MAX_METADATA_BYTES = 65_536
MAX_METADATA_DEPTH = 32
MAX_TEXT_CHARS = 4096  # a form field other than metadata (uri, callback_url, a filename)


class BadInput(ValueError):
    """A request value the API refuses; its message is the one-line reason."""


def _storable(name: str, value: str) -> None:
    """PostgreSQL stores no NUL, and only text that is valid UTF-8 (no lone surrogate)."""
    if "\x00" in value:
        raise BadInput(f"`{name}` contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"`{name}` is not valid Unicode (a lone surrogate)") from None


def text_field(name: str, value: str | None) -> str | None:
    """`value` unless it cannot be stored (`_storable`) or is over MAX_TEXT_CHARS."""
    if value is None:
        return None
    _storable(name, value)
    if len(value) > MAX_TEXT_CHARS:
        raise BadInput(f"`{name}` is over {MAX_TEXT_CHARS} characters")
    return value


def _no_constant(name: str) -> Any:
    raise BadInput(f"`metadata` holds {name}, which is not JSON")


def metadata(text: str | None) -> dict[str, Any]:
    """The `metadata` form field as a JSON object of at most MAX_METADATA_BYTES, nested at
    most MAX_METADATA_DEPTH deep, every key and string storable, no NaN or Infinity."""
    if not text:
        return {}
    if len(text.encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
        raise BadInput(f"`metadata` is over {MAX_METADATA_BYTES} bytes")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BadInput(f"`metadata` is nested over {MAX_METADATA_DEPTH} deep") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"`metadata` is not JSON: {exc.msg} at character {exc.pos}") from None
    except BadInput:
        raise
    except ValueError:  # an integer past Python's digit limit
        raise BadInput("`metadata` holds a number too long to read") from None
    if not isinstance(value, dict):
        raise BadInput("`metadata` must be a JSON object")
    check_json(value)
    return value


def check_json(value: Any) -> None:
    """Depth and storability checks over a parsed JSON value, without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_METADATA_DEPTH:
            raise BadInput(f"`metadata` is nested over {MAX_METADATA_DEPTH} deep")
        if isinstance(item, str):
            _storable("metadata", item)
        elif isinstance(item, dict):
            for key, child in item.items():
                _storable("metadata", key)
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
