"""A process that runs the models maps large blocks on their own (`bound_heap`), so freeing
one large tensor does not move glibc's threshold and send the next ones to the heap, where
their holes make it grow."""

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


def _mapped(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(_libc() is None, reason="glibc only")
def test_large_blocks_are_mapped_on_their_own_once_the_heap_is_bounded() -> None:
    assert _mapped("free") == 0  # glibc's own rule: after the 24 MB free, 8 MB is heap
    assert _mapped("bound") >= 8 << 20
