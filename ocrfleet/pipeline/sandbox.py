"""Page split under a budget: every PDF render and image decode of an input runs in a child
process with a memory limit (RLIMIT_AS) and a wall-clock limit per step.

A 2 KB PDF of nested Form XObjects or a stream that inflates to gigabytes makes PDFium
spend minutes and gigabytes on one page; nothing in PDFium bounds that. Here the child
takes it: over `render_memory_mb` its allocations fail (PDFium aborts, Pillow raises
MemoryError), past `render_timeout_s` on one step (opening and probing the input, or one
page) the parent kills it. Either way the input is rejected with reason `render_budget`
and the calling process (a Celery ingest worker, `ocrfleet run`) goes on with the next
one. A child lives on across pages and documents, so a page costs no process start, only
a pipe (the page goes back as PNG bytes, the form the store keeps); and it renders the
next page while the caller stores this one.

The child speaks length-prefixed pickles on its stdin and stdout: `open` (input bytes,
settings) answers the `ir.Document`, `next` answers the next page or `None`, `close`
drops the document. It reads only what its parent writes, so the pickles are trusted.
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.pipeline.images import InputRejected

__all__ = ["RenderedPage", "Split", "close_idle", "split_document"]

BUDGET = "render_budget"
_HEADER = struct.Struct("!Q")
_CHILD_DOCUMENTS = 200  # a child is replaced after this many documents (heap drift)
_CPU_SLACK_S = 5  # RLIMIT_CPU backstop per step, over the wall-clock limit
_START_TIMEOUT_S = 120  # a child's imports, on a loaded machine
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_CHILD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # glibc: a page's bitmaps (15 MB at A4 and 200 dpi) come from the heap and stay there
    # between pages; mmap'd afresh each page they cost ~10,000 page faults, +50% CPU.
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(128 << 20),
}


@dataclass(frozen=True)
class RenderedPage:
    """One page as the store keeps it: PNG bytes of the RGB image, and its size."""

    number: int
    width: int
    height: int
    png: bytes


class _ChildGone(Exception):
    """The child died or stopped answering mid-step; `why` says which."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class _Child:
    """One renderer process and its pipes."""

    def __init__(self) -> None:
        env = {**os.environ, **_CHILD_ENV}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ocrfleet.pipeline.sandbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.documents = 0
        self.busy = True  # until it says it is ready: its start is no input's time
        self.sent_at = time.monotonic()
        try:
            self._answer(self.sent_at + _START_TIMEOUT_S)
        except _ChildGone as gone:
            self.kill()
            raise RuntimeError(f"the renderer process did not start: {gone.why}") from None
        self.busy = False

    def send(self, message: tuple[Any, ...]) -> None:
        """Send one request; its answer is `receive()`'s to read."""
        self.busy, self.sent_at = True, time.monotonic()
        try:
            _write(self.proc.stdin, message)  # type: ignore[arg-type]
        except OSError:  # BrokenPipeError: it is gone
            raise _ChildGone(self._death()) from None

    def receive(self, timeout_s: float) -> Any:
        """The answer to the request sent last, due `timeout_s` after it was sent."""
        answer = self._answer(self.sent_at + timeout_s)
        self.busy = False
        return answer

    def request(self, message: tuple[Any, ...], timeout_s: float) -> Any:
        self.send(message)
        return self.receive(timeout_s)

    def _answer(self, deadline: float) -> Any:
        header = self._read(_HEADER.size, deadline)
        return pickle.loads(self._read(_HEADER.unpack(header)[0], deadline))

    def _read(self, size: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        chunks, got = [], 0
        while got < size:
            # An answer already there is taken even past the deadline: it was not late
            # while its reader was busy elsewhere (storing the page before it).
            left = max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise _ChildGone("timeout")
            chunk = os.read(fd, min(size - got, 1 << 20))
            if not chunk:
                raise _ChildGone(self._death())
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "no answer"
        if code < 0:
            with suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def kill(self) -> None:
        self.busy = False
        with suppress(ProcessLookupError):
            self.proc.kill()
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with suppress(OSError):
                pipe.close()  # type: ignore[union-attr]

    def alive(self) -> bool:
        return self.proc.poll() is None


_idle: list[_Child] = []
_idle_lock = threading.Lock()


def _take() -> _Child:
    with _idle_lock:
        while _idle:
            child = _idle.pop()
            if child.alive():
                return child
            child.kill()
    return _Child()


def _give_back(child: _Child) -> None:
    if child.alive() and child.documents < _CHILD_DOCUMENTS:
        with _idle_lock:
            _idle.append(child)
    else:
        child.kill()


def close_idle() -> None:
    """Stop the renderer children that wait for the next input: when a process is done
    splitting (`ocrfleet run` reads its pages next), their memory is the pages' to use."""
    with _idle_lock:
        children = list(_idle)
        _idle.clear()
    for child in children:
        child.kill()


class Split:
    """An input opened in a renderer child: `document` describes it, `pages()` renders it
    page by page. Made by `split_document`, which owns the child."""

    def __init__(self, child: _Child, document: ir.Document, settings: Settings) -> None:
        self._child = child
        self._settings = settings
        self.document = document
        self.finished = False

    def pages(self) -> Iterator[RenderedPage]:
        """The pages in order. The child renders page n + 1 while the caller has page n
        (stores it), so the pipe's round trip costs no time of its own."""
        child, settings = self._child, self._settings
        _ask(child, settings, "page 1", send=("next",), receive=False)
        number = 1
        while not self.finished:
            page = _ask(child, settings, f"page {number}")
            if page is None:
                self.finished = True
                return
            number += 1
            _ask(child, settings, f"page {number}", send=("next",), receive=False)
            yield page


def _ask(
    child: _Child,
    settings: Settings,
    step: str,
    *,
    send: tuple[Any, ...] | None = None,
    receive: bool = True,
) -> Any:
    """One step in the child (`send` a request, `receive` its answer, or both): the answer;
    InputRejected for a bad input, or with reason `render_budget` for a step over the
    budget (the child is killed)."""
    timeout_s, memory_mb = settings.render_timeout_s, settings.render_memory_mb
    try:
        if send is not None:
            child.send(send)
        if not receive:
            return None
        kind, *value = child.receive(timeout_s)
    except _ChildGone as gone:
        child.kill()
        if gone.why == "timeout":
            detail = f"{step} took over {timeout_s:g} s (render_timeout_s)"
        else:
            detail = (
                f"the renderer died ({gone.why}) on {step}: over the memory limit of "
                f"{memory_mb} MB (render_memory_mb), or a crash on these bytes"
            )
        raise InputRejected(BUDGET, detail) from None
    if kind == "ok":
        return value[0]
    if kind == "rejected":
        raise InputRejected(*value)
    if kind == "memory":
        child.kill()  # its heap is a wreck: start afresh
        raise InputRejected(BUDGET, f"{step} needed over {memory_mb} MB (render_memory_mb)")
    raise RuntimeError(f"{step}: {value[0]}")  # a fault of ours or a library's


@contextmanager
def split_document(data: bytes, settings: Settings, source_uri: str) -> Iterator[Split]:
    """Validate `data` against every limit and describe it (`Split.document`), then render
    its pages on demand (`Split.pages()`), all in a renderer child under the budget.
    Raises InputRejected for a bad input, with reason `render_budget` for one over it."""
    child = _take()
    split = None
    try:
        opening = ("open", data, settings, source_uri)
        document = _ask(child, settings, "opening the input", send=opening)
        child.documents += 1
        split = Split(child, document, settings)
        yield split
    finally:
        if child.busy:
            child.kill()  # interrupted mid-step (a task time limit): its state is unknown
        elif split is not None and not split.finished and child.alive():
            with suppress(_ChildGone):  # the caller stopped early: drop the document
                child.request(("close",), settings.render_timeout_s)
        _give_back(child)


# -- the child -------------------------------------------------------------------------


def _write(stream: IO[bytes], message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)))
    stream.write(body)
    stream.flush()


def _read_message(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None  # the parent closed the pipe: exit
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


def _limit(settings: Settings) -> None:
    """This step's budget: address space, and CPU seconds as a backstop for the parent's
    wall clock (if the parent dies mid-step, nobody else would stop this process)."""
    memory = settings.render_memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, resource.RLIM_INFINITY))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime)
    cpu = used + int(settings.render_timeout_s) + _CPU_SLACK_S
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))


def _unlimit() -> None:
    """No budget between steps: reading the next input is not the input's work."""
    for limit in (resource.RLIMIT_AS, resource.RLIMIT_CPU):
        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    from ocrfleet.pipeline.split import iter_pages_with_text, open_document
    from ocrfleet.pipeline.textlayer import page_png

    pages: Iterator[Any] | None = None
    number = 0
    settings: Settings | None = None
    _write(stdout, ("ready",))
    while True:
        message = _read_message(stdin)
        if message is None:
            return
        op = message[0]
        try:
            if op == "open":
                _, data, settings, source_uri = message
                if pages is not None:
                    pages.close()
                pages, number = None, 0
                _limit(settings)
                document = open_document(data, settings, source_uri)
                pages = iter_pages_with_text(data, settings)
                answer: tuple[Any, ...] = ("ok", document)
            elif op == "next":
                assert pages is not None and settings is not None, "next before open"
                _limit(settings)
                found = next(pages, None)
                if found is None:
                    pages = None
                    answer = ("ok", None)
                else:
                    image, layer = found
                    number += 1
                    page = RenderedPage(number, image.width, image.height, page_png(image, layer))
                    image.close()
                    answer = ("ok", page)
            elif op == "close":
                if pages is not None:
                    pages.close()
                pages, answer = None, ("ok", None)
            else:
                raise ValueError(f"unknown request {op!r}")
        except InputRejected as rejected:
            pages, answer = None, ("rejected", rejected.reason, rejected.detail)
        except MemoryError:
            pages, answer = None, ("memory",)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
            from ocrfleet.errors import describe

            pages, answer = None, ("error", describe(exc))
        _unlimit()
        _write(stdout, answer)


if __name__ == "__main__":
    # Nothing but this protocol may reach stdout: a stray print would desynchronise it.
    _out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
    # By its importable name, so the pickled pages name their class as the parent knows it.
    from ocrfleet.pipeline import sandbox

    sandbox._serve(sys.stdin.buffer, _out)
