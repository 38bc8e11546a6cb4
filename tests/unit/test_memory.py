"""A process that runs the models maps large blocks on their own (`bound_heap`), so freeing
one large tensor does not move glibc's threshold and send the next ones to the heap, where
their holes make it grow; what a page freed between live blocks goes back once the page is
persisted (`release_memory`). Each probe runs in a fresh interpreter: the test process's own
heap (gigabytes after the model tests, its threshold already bound) would decide the result."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ocrfleet.memory import HUGE_PAGES, _libc, huge_pages_env

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


def test_huge_pages_are_added_to_the_tunables_a_user_set_and_never_over_their_choice() -> None:
    if _libc() is None:
        assert huge_pages_env({"A": "1"}) == {"A": "1"}
        return
    assert huge_pages_env({"A": "1"}) == {"A": "1", "GLIBC_TUNABLES": HUGE_PAGES}
    other = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert huge_pages_env(other)["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{HUGE_PAGES}"
    off = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert huge_pages_env(off) == off


# Hold one 32 MB block (mapped on its own) and print how much of it is on huge pages.
HUGE = """
import ctypes
from pathlib import Path
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
size = 32 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
print(next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:")))
"""


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "never"
    return text.split("[", 1)[1].split("]", 1)[0]


@pytest.mark.skipif(_libc() is None, reason="glibc only")
@pytest.mark.skipif(_thp_mode() != "madvise", reason="huge pages only on request here")
def test_a_process_started_with_huge_pages_gets_them() -> None:
    plain = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}

    def huge_kb(env: dict[str, str]) -> int:
        done = subprocess.run(
            [sys.executable, "-c", HUGE], env=env, capture_output=True, text=True, check=True
        )
        return int(done.stdout)

    assert huge_kb(plain) == 0
    assert huge_kb(huge_pages_env(plain)) >= 2048


@pytest.mark.skipif(_libc() is None, reason="glibc only")
def test_run_starts_itself_again_with_huge_pages(tmp_path: Path) -> None:
    """`ocrfleet run` reads pages in its own process: the tunable must be in its environment
    (glibc reads it at start), whatever the caller's was."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env |= {
        "OCRFLEET_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
        "OCRFLEET_STORE_URL": f"file://{tmp_path / 'store'}",
        "OCRFLEET_CACHE_DIR": str(tmp_path / "cache"),
    }
    example = Path(__file__).parents[2] / "examples" / "memo.tif"
    run = subprocess.Popen(
        [sys.executable, "-m", "ocrfleet.cli", "run", "--jobs", "1", str(example)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen = ""
    try:
        deadline = time.monotonic() + 60
        while HUGE_PAGES not in seen and run.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                seen = Path(f"/proc/{run.pid}/environ").read_bytes().decode(errors="replace")
            time.sleep(0.05)
    finally:
        run.kill()
        run.wait(timeout=30)
    assert HUGE_PAGES in seen
