"""The embedded object store: a directory, addressed by `file://` URIs.

Writes go to a temp file in the target directory and are renamed into place, so a reader
never sees half an object and a crash leaves at most a hidden temp file. Every key is
checked twice: by the shared key rules, then by resolving the real path and requiring it to
stay under the root, so a symlink inside the store cannot lead a key outside it.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO, NoReturn
from urllib.parse import quote, unquote, unquote_to_bytes

from ocrfleet.storage.base import (
    AccessDenied,
    InvalidKey,
    ObjectNotFound,
    ObjectStore,
    StorageError,
)
from ocrfleet.storage.keys import validate_key, validate_prefix

SCHEME = "file://"
TEMP_PREFIX = ".ocrfleet-tmp-"  # names of in-flight writes; never listed, never valid keys


def file_uri_to_path(uri: str) -> Path:
    """`file:///abs/p` or `file://./rel/p` (relative to cwd) -> absolute path, percent-decoded.

    Not resolved: symlinks are the store's business, and `..` in a URI is collapsed only
    lexically so a containment check afterwards sees where the path really points.
    """
    if not uri.startswith(SCHEME):
        raise ValueError(f"not a file:// URI: {uri!r}")
    # Bytes first, then the file system's decoding: a name that is not UTF-8 comes back
    # exactly (as surrogate escapes), where unquote() would replace its bytes with U+FFFD.
    rest = os.fsdecode(unquote_to_bytes(uri[len(SCHEME) :]))
    if not rest:
        raise ValueError(f"file:// URI without a path: {uri!r}")
    if "\x00" in rest:
        raise InvalidKey(f"file:// URI contains NUL: {uri!r}")
    return Path(os.path.abspath(rest))


def storable_uri(uri: str) -> str:
    """`uri` as it can be stored and sent anywhere (UTF-8 text): unchanged when it is
    already, else (a local path whose name is not valid UTF-8) the `file://` URI of the
    path with its raw bytes percent-encoded, which `read_uri` reads back exactly."""
    try:
        uri.encode("utf-8")
    except UnicodeEncodeError:
        if "://" in uri:
            raise InvalidKey(f"URI is not valid UTF-8: {display_uri(uri)}") from None
        return Path(os.path.abspath(uri)).as_uri()
    return uri


def display_uri(uri: str) -> str:
    """A source URI or path as a person reads it: percent-encoded `file://` URIs and
    undecodable bytes of a name shown as `\\xNN` escapes, everything else as it is."""
    if uri.startswith(SCHEME) and "%" in uri:
        with contextlib.suppress(ValueError):  # InvalidKey is a ValueError
            uri = str(file_uri_to_path(uri))
    return uri.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _raise_os_error(exc: OSError, what: str) -> NoReturn:
    if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError):
        raise ObjectNotFound(f"{what}: no such object") from exc
    if isinstance(exc, PermissionError):
        raise AccessDenied(f"{what}: permission denied") from exc
    raise StorageError(f"{what}: {exc}") from exc


class LocalStore(ObjectStore):
    """Objects are files under `root`; keys map to relative paths."""

    def __init__(self, url: str) -> None:
        path = file_uri_to_path(url)
        self._root = path.resolve()
        self._url = self._root.as_uri()
        # key_of() also accepts URIs spelled like the URL the store was opened with
        # (`file://./store/k`, a symlinked root), compared as strings: no normalisation.
        given = unquote(url[len(SCHEME) :]).rstrip("/")
        self._root_spellings = sorted({str(self._root), str(path), given}, key=len, reverse=True)

    @property
    def url(self) -> str:
        return self._url

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str) -> Path:
        validate_key(key)
        if key.rsplit("/", 1)[-1].startswith(TEMP_PREFIX):
            raise InvalidKey(f"key names are reserved for temp files ({TEMP_PREFIX}*): {key!r}")
        path = self._root / key
        try:
            real = path.resolve()
        except (OSError, RuntimeError) as exc:  # symlink loop
            raise InvalidKey(f"key {key!r} does not resolve: {exc}") from exc
        if real == self._root or not real.is_relative_to(self._root):
            raise InvalidKey(f"key {key!r} resolves outside the store root {self._root}")
        return path

    def put(self, key: str, data: bytes | BinaryIO, content_type: str | None = None) -> str:
        """`content_type` is accepted for parity with S3 and not stored."""
        path = self._path(key)
        what = f"put {self.uri(key)}"
        if path.is_dir():
            raise StorageError(f"{what}: a directory of that name holds other keys")
        temp = path.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                with os.fdopen(fd, "wb") as handle:
                    if isinstance(data, bytes | bytearray | memoryview):
                        handle.write(data)
                    else:
                        shutil.copyfileobj(data, handle, 1 << 20)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, path)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
        except (FileExistsError, NotADirectoryError) as exc:
            raise StorageError(f"{what}: a parent segment of the key is an object") from exc
        except PermissionError as exc:
            raise AccessDenied(f"{what}: permission denied") from exc
        except OSError as exc:
            raise StorageError(f"{what}: {exc}") from exc
        return self.uri(key)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except OSError as exc:
            _raise_os_error(exc, f"get {self.uri(key)}")

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            return  # a "directory" is not an object: nothing to delete, as on S3
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            _raise_os_error(exc, f"delete {self.uri(key)}")

    def list(self, prefix: str = "") -> builtins.list[str]:
        validate_prefix(prefix)
        head, _, partial = prefix.rpartition("/")
        start = self._root / head if head else self._root
        try:
            real_start = start.resolve()
        except (OSError, RuntimeError):
            return []
        if not real_start.is_relative_to(self._root) or not real_start.is_dir():
            return []
        keys: builtins.list[str] = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel_dir = Path(dirpath).relative_to(self._root).as_posix()
            base = "" if rel_dir == "." else rel_dir + "/"
            if dirpath == str(start):
                dirnames[:] = [name for name in dirnames if name.startswith(partial)]
            for name in filenames:
                key = base + name
                if name.startswith(TEMP_PREFIX) or not key.startswith(prefix):
                    continue
                if self._listable(key):
                    keys.append(key)
        return sorted(keys)

    def _listable(self, key: str) -> bool:
        try:
            return self._path(key).is_file()
        except InvalidKey:
            return False  # a file name that is no valid key, or a symlink leading out

    def uri(self, key: str) -> str:
        validate_key(key)
        return f"{self._url.rstrip('/')}/{quote(key, safe='/')}"

    def key_of(self, uri: str) -> str:
        if not uri.startswith(SCHEME):
            raise InvalidKey(f"{uri!r} is not inside {self._url}: not a file:// URI")
        raw = unquote(uri[len(SCHEME) :])
        for root in self._root_spellings:
            head = root.rstrip("/") + "/"
            if raw.startswith(head):
                return validate_key(raw[len(head) :])
        raise InvalidKey(f"{uri!r} is not inside {self._url}")
