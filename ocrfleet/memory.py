"""A process's memory: give freed memory back after each page, and measure the peak.

onnxruntime's detector allocates a few hundred MB of activations per page and frees them;
glibc keeps much of that in its heap (fragmented between pages' allocations), so a worker's
resident memory drifts up page after page although nothing is live. `release_memory` hands
the free heap back (`malloc_trim`, a few ms per page).

Within a page the same happens call by call: glibc raises its mmap threshold to the size of
each large block freed (up to 32 MB), so the models' multi-megabyte tensors come from the
heap, and the holes they leave between small live objects make it grow. On realdocs and
olmOCR pages recognition peaked 230-520 MB over the process's base in some runs and not in
others. `bound_heap` fixes the threshold at `MMAP_THRESHOLD`: a block that large is mapped
and unmapped on its own, so a stage's peak is what it holds. Measured in process on 9 pages
(2 runs each): the highest stage peak 407-440 MB against 480-808 MB, for +11-15% time in
recognition and +5-8% in line detection (page faults on fresh mappings).

Those faults are cheaper on huge pages. Where the kernel gives transparent huge pages only
on request (`madvise`, Debian's default), glibc asks for them on its mapped blocks and heap
when started with `glibc.malloc.hugetlb=1` (`GLIBC_TUNABLES`, read once at process start,
so a process that runs the models gets it from its parent: `huge_pages_env`). Measured with
`ocrfleet run --jobs 1` on the same 9 pages, alternating: 32.9-37.7 s against 36.8-41.6 s
(-10 to -12%), peak 463-475 MB against 452-488 MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import threading
from collections.abc import Mapping
from contextlib import suppress
from functools import lru_cache
from pathlib import Path

__all__ = [
    "PeakRss",
    "bound_heap",
    "huge_pages_env",
    "peak_mb",
    "release_memory",
    "rss_mb",
    "tree_rss_mb",
]

_PF_FORKNOEXEC = 0x40  # /proc/<pid>/stat flags: forked, not yet exec'd (linux/sched.h)
MMAP_THRESHOLD = 4 << 20  # bytes: blocks this large are mapped on their own (glibc)
_M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
HUGE_PAGES = "glibc.malloc.hugetlb=1"  # glibc >= 2.35; older ones ignore it


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018  (glibc only)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def release_memory() -> None:
    """Return the heap's free memory to the system: call when a page is persisted and its
    images are gone. A no-op where the C library is not glibc."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def bound_heap() -> bool:
    """Map blocks of `MMAP_THRESHOLD` and over on their own from now on (see the module's
    note). Call once in a process that will run the models; False where the C library is
    not glibc."""
    libc = _libc()
    return libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


def huge_pages_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a process that will run the models: glibc's huge-page tunable added to
    `GLIBC_TUNABLES` (see the module's note). A hugetlb value already there is the user's
    choice (`glibc.malloc.hugetlb=0` turns it off) and is kept; so is every other tunable.
    Unchanged where the C library is not glibc."""
    env = dict(environ)
    tunables = env.get("GLIBC_TUNABLES", "")
    if _libc() is None or "glibc.malloc.hugetlb" in tunables:
        return env
    env["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGES}" if tunables else HUGE_PAGES
    return env


def _status_mb(pid: int | str, field: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of one process in MB (0.0 once it is gone)."""
    return _status_mb(pid, "VmRSS")


def peak_mb(pid: int | str = "self") -> float:
    """One process's peak resident memory in MB since the last call (`VmHWM`, then reset
    to its current RSS: the kernel's own counter, so no peak between samples is missed)."""
    peak = _status_mb(pid, "VmHWM")
    with suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    return peak


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _not_executed(pid: int) -> bool:
    """Whether `pid` was forked and has not called exec since (the kernel's PF_FORKNOEXEC)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return bool(int(stat.rsplit(")", 1)[1].split()[6]) & _PF_FORKNOEXEC)


def tree_rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process and all its descendants together, in MB.

    A descendant that has not exec'd since it was forked is not counted: its resident pages
    are its parent's (a vfork child, as `subprocess` starts each command, shares the
    parent's memory until exec; a forked one shares it copy-on-write), so adding them
    counted the parent twice whenever a sample fell between a fork and its exec (tesseract's
    processes are started on every page): `ocrfleet run` on 9 pages peaked at 693 MB in one
    run of 4 and 724 MB in one of 4 with another scorer, 504-529 MB in the other 6, and
    the largest stage peak inside the process of the 724 MB run was 515 MB."""
    pid = os.getpid() if pid is None else pid
    total, todo = rss_mb(pid), _children(pid)
    while todo:
        current = todo.pop()
        if not _not_executed(current):
            total += rss_mb(current)
        todo += _children(current)
    return total


class PeakRss:
    """The peak of this process tree's resident memory while the block runs: sampled every
    `interval_s` (the sum over the processes alive at once), and never under the largest
    single process's own peak as the kernel counts it. `descendants_only`: only the
    processes this one starts (a bench measuring each command it runs), sampled alone."""

    def __init__(self, interval_s: float = 0.2, *, descendants_only: bool = False) -> None:
        self.interval_s = interval_s
        self.descendants_only = descendants_only
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.descendants_only:  # the kernel's peaks span this process's whole life
            return
        own = max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        self.peak_mb = max(self.peak_mb, own / 1024)

    def _sample(self) -> None:
        while True:
            if self.descendants_only:
                now = sum(tree_rss_mb(child) for child in _children(os.getpid()))
            else:
                now = tree_rss_mb()
            self.peak_mb = max(self.peak_mb, now)
            if self._stop.wait(self.interval_s):
                return
