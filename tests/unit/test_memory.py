"""A process that runs the models maps large blocks on their own (`bound_heap`), so freeing
one large tensor does not move glibc's threshold and send the next ones to the heap, where
their holes make it grow; what a page freed between live blocks goes back once the page is
persisted (`release_memory`). Each probe runs in a fresh interpreter: the test process's own
heap (gigabytes after the model tests, its threshold already bound) would decide the result."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ocrfleet.memory import _libc

# In a fresh interpreter: free a 24 MB block (glibc then raises its mmap threshold to 24 MB),
# then hold an 8 MB block and print the bytes held in mapped blocks.
PROBE = """
import ctypes, sys
from ocrfleet.memory import bound_heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class Info(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]
libc.mallinfo2.restype = Info
if sys.argv[1] == "bound":
    assert bound_heap()
libc.free(libc.malloc(24 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(8 << 20)
print(libc.mallinfo2().hblkhd - before)
libc.free(block)
"""


# Freed blocks between live ones (a page's buffers between the models' allocations) stay
# resident until the heap is trimmed: glibc only returns its top by itself.
RELEASE = """
from ocrfleet.memory import release_memory, rss_mb
blocks, live = [], []
for _ in range(3000):  # ~190 MB in heap-sized pieces, each followed by a live one
    blocks.append(bytearray(64 << 10))
    live.append(bytearray(600))
del blocks
before = rss_mb()
release_memory()
print(before, rss_mb(), len(live))
"""


def _mapped(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(_libc() is None, reason="glibc only")
def test_large_blocks_are_mapped_on_their_own_once_the_heap_is_bounded() -> None:
    assert _mapped("free") == 0  # glibc's own rule: after the 24 MB free, 8 MB is heap
    assert _mapped("bound") >= 8 << 20


@pytest.mark.skipif(_libc() is None, reason="glibc only")
def test_release_memory_gives_freed_heap_back() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True
    )
    before, after, live = done.stdout.split()
    assert float(after) < float(before) - 100
    assert int(live) == 3000
