"""What the split's budget costs on a normal PDF, and what it does to PDF bombs.

    python bench/render_budget.py [--pages 20] [--timeout-s 60] [--memory-mb 2048]

A normal PDF (text pages at the settings' DPI) is split in this process (`iter_pages`,
then PNG as the store keeps it) and through the budgeted child (`split_document`), each
best of five, in turns; the lines `wall|cpu per page: in-process X ms, budgeted Y ms,
overhead Z ms (ratio R)` (CPU time counts the child's) and `child start: S s` say what a
page and a process pay. Then each bomb of
bench/hostile.py goes through the budget: its size, what it ends as, and how long that took.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.hostile import pdf_inflate_bomb, pdf_xobject_bomb  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.pipeline import sandbox  # noqa: E402
from ocrfleet.pipeline.images import InputRejected, encode_png  # noqa: E402
from ocrfleet.pipeline.split import iter_pages, open_document  # noqa: E402
from tests.fixtures.badinputs import pdf_bytes  # noqa: E402


def in_process(data: bytes, settings: Settings) -> int:
    open_document(data, settings, "bench.pdf")
    return sum(len(encode_png(image)) for image in iter_pages(data, settings))


def budgeted(data: bytes, settings: Settings) -> int:
    with sandbox.split_document(data, settings, "bench.pdf") as split:
        return sum(len(page.png) for page in split.pages())


def cpu_seconds() -> float:
    """CPU time of this process and its idle renderer child (the one `budgeted` uses)."""
    total = time.process_time()
    for child in sandbox._idle:  # noqa: SLF001 - a bench may look inside
        fields = Path(f"/proc/{child.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def best_of(runs: int, data: bytes, settings: Settings) -> dict[str, tuple[float, float]]:
    """{"wall"|"cpu": (in-process, budgeted)} seconds, each the best of `runs`, taken in
    turns so a busy machine weighs on both alike. CPU time counts the child's too."""
    times: dict[str, dict[object, list[float]]] = {
        "wall": {in_process: [], budgeted: []},
        "cpu": {in_process: [], budgeted: []},
    }
    for _ in range(runs):
        for work in (in_process, budgeted):
            wall, cpu = time.perf_counter(), cpu_seconds()
            work(data, settings)  # type: ignore[operator]
            times["cpu"][work].append(cpu_seconds() - cpu)
            times["wall"][work].append(time.perf_counter() - wall)
    return {kind: (min(seen[in_process]), min(seen[budgeted])) for kind, seen in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--timeout-s", type=float, default=None, help="render_timeout_s")
    parser.add_argument("--memory-mb", type=int, default=None, help="render_memory_mb")
    args = parser.parse_args()
    values = {"render_timeout_s": args.timeout_s, "render_memory_mb": args.memory_mb}
    settings = Settings(_env_file=None, **{k: v for k, v in values.items() if v is not None})

    data = pdf_bytes(pages=args.pages)
    started = time.perf_counter()
    budgeted(pdf_bytes(pages=1), settings)  # starts the child
    print(f"child start: {time.perf_counter() - started:.2f} s (once per process)")
    assert in_process(data, settings) == budgeted(data, settings)  # the same PNG bytes
    print(f"{args.pages} pages at {settings.dpi} dpi")
    for kind, (plain, budget) in best_of(5, data, settings).items():
        plain, budget = plain / args.pages, budget / args.pages
        print(
            f"{kind} per page: in-process {plain * 1000:.1f} ms, budgeted {budget * 1000:.1f} "
            f"ms, overhead {(budget - plain) * 1000:.1f} ms (ratio {budget / plain:.3f})"
        )

    print(f"bombs, under {settings.render_timeout_s:g} s and {settings.render_memory_mb} MB:")
    for name, make in (
        ("xobjects_7_deep", lambda: pdf_xobject_bomb(7)),
        ("xobjects_8_deep", lambda: pdf_xobject_bomb(8)),
        ("inflates_to_1_GiB", lambda: pdf_inflate_bomb(1024)),
    ):
        bomb = make()
        started = time.perf_counter()
        try:
            budgeted(bomb, settings)
            outcome = "rendered"
        except InputRejected as rejected:
            outcome = str(rejected)
        elapsed = time.perf_counter() - started
        print(f"  {name:<18} {len(bomb):>6} bytes  {elapsed:5.1f} s  {outcome[:110]}")


if __name__ == "__main__":
    main()
