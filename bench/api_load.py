"""Load on the HTTP API, loopback only: status polls and uploads at once, then submit
throughput through the API against `client.submit` called directly.

Services as bench/fleet_throughput.py makes them (a Redis of its own, a throwaway
PostgreSQL database, moto's S3 server) and `ocrfleet api --workers N`; no OCR workers, so
the numbers are the API's own (submissions are enqueued, not processed).

Mixed load, `--seconds` long: `--pollers` clients each polling one document's status in a
loop, and uploads of distinct one-page PDFs started at `--upload-rate` a second (at most
`--max-in-flight` at once). Prints p50/p95/max latency and errors per kind. Then
`--status-seconds` of status polls alone.

Each phase also prints the CPU the API processes spent per request (/proc): latency on a
shared machine is mostly time spent waiting for a CPU, the CPU per request is the API's.

Submit throughput, `--ratio-seconds` each: `--submitters` concurrent uploads through the
API, then the same number of threads calling `client.submit` with the same settings in
this process. The last line reads `ratio api/client submit: X.XX`.

    python bench/api_load.py [--seconds 60] [--pollers 200] [--upload-rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack, suppress
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.fleet_throughput import process, services  # noqa: E402
from ocrfleet import client  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.integration.fleet_helpers import (  # noqa: E402
    make_document,
    ocrfleet_cli,
    process_env,
    settings_from,
)

BASE_PDF = make_document(1, 1)


def unique_pdf() -> bytes:
    """A distinct document each time (a trailing comment after %%EOF changes the hash)."""
    return BASE_PDF + f"\n% {uuid.uuid4().hex}\n".encode()


class Stats:
    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = {}
        self.errors: dict[str, list[str]] = {}

    def record(self, kind: str, started: float, error: str | None) -> None:
        self.latencies.setdefault(kind, []).append(time.perf_counter() - started)
        if error is not None:
            self.errors.setdefault(kind, []).append(error)

    def skip(self, kind: str, reason: str) -> None:
        """A request never sent (the in-flight bound): an error, but no latency."""
        self.errors.setdefault(kind, []).append(f"skipped: {reason}")

    def succeeded(self, kind: str) -> int:
        sent_failed = [e for e in self.errors.get(kind, []) if not e.startswith("skipped")]
        return len(self.latencies.get(kind, [])) - len(sent_failed)

    def report(self) -> None:
        for kind, values in sorted(self.latencies.items()):
            ms = np.asarray(values) * 1000
            errors = Counter(error.split(":")[0] for error in self.errors.get(kind, []))
            kinds = ", ".join(f"{count} {name}" for name, count in errors.most_common())
            print(
                f"{kind:>7}: {len(values)} requests, p50 {np.percentile(ms, 50):.1f} ms, "
                f"p95 {np.percentile(ms, 95):.1f} ms, max {ms.max():.1f} ms, "
                f"errors {errors.total()}" + (f" ({kinds})" if kinds else "")
            )


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc): the API process and its uvicorn workers."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with suppress(OSError):
                todo += [int(child) for child in (task / "children").read_text().split()]
    return pids


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by `pids` (those still running)."""
    total = 0
    for pid in pids:
        with suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


class CPU:
    """CPU the API processes spent on a phase: per request, it does not depend on how
    busy the machine is (latency does: on a shared machine it is mostly waiting for CPU)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.started = pids, cpu_seconds(pids)

    def per_request(self, label: str, requests: int) -> None:
        used = cpu_seconds(self.pids) - self.started
        print(f"API CPU, {label}: {used:.1f} s for {requests} requests = "
              f"{1000 * used / max(1, requests):.2f} ms a request")


async def call(http: httpx.AsyncClient, stats: Stats, kind: str, method: str, url: str, **kw):  # noqa: ANN001, ANN003, ANN201
    started = time.perf_counter()
    try:
        response = await http.request(method, url, **kw)
        error = None if response.status_code < 300 else f"HTTP {response.status_code}"
    except httpx.HTTPError as exc:
        response, error = None, f"{type(exc).__name__}: {exc}"
    stats.record(kind, started, error)
    return response


async def mixed(
    base: str, key: str, doc_id: int, args: argparse.Namespace, seconds: float, uploading: bool
) -> Stats:
    stats = Stats()
    limits = httpx.Limits(max_connections=args.pollers + args.max_in_flight)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=60
    ) as http:
        stop = time.monotonic() + seconds

        async def poller() -> None:
            while time.monotonic() < stop:
                await call(http, stats, "status", "GET", f"/v1/documents/{doc_id}")

        async def uploads() -> None:
            in_flight = asyncio.Semaphore(args.max_in_flight)
            tasks = []
            interval, next_at = 1.0 / args.upload_rate, time.monotonic()

            async def one() -> None:
                async with in_flight:
                    files = {"file": ("load.pdf", unique_pdf(), "application/pdf")}
                    await call(http, stats, "upload", "POST", "/v1/documents", files=files)

            while time.monotonic() < stop:
                if in_flight.locked():
                    stats.skip("upload", "too many in flight")
                else:
                    tasks.append(asyncio.create_task(one()))
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await asyncio.gather(*tasks)

        loads = [uploads()] if uploading else []
        await asyncio.gather(*loads, *(poller() for _ in range(args.pollers)))
    return stats


async def api_submits(base: str, key: str, args: argparse.Namespace) -> tuple[float, int]:
    """(documents a second, documents) through POST /v1/documents, `submitters` in flight."""
    done = 0
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as http:
        stop = time.monotonic() + args.ratio_seconds
        started = time.monotonic()

        async def submitter() -> None:
            nonlocal done
            while time.monotonic() < stop:
                files = {"file": ("r.pdf", unique_pdf(), "application/pdf")}
                response = await http.post("/v1/documents", files=files)
                response.raise_for_status()
                done += 1

        await asyncio.gather(*(submitter() for _ in range(args.submitters)))
        return done / (time.monotonic() - started), done


def client_submits(env: dict[str, str], args: argparse.Namespace) -> float:
    """Documents a second through `client.submit` from `submitters` threads."""
    settings = settings_from(env)
    client.submit(unique_pdf(), settings=settings)  # warm: run id, store, broker connection
    done = [0] * args.submitters
    stop = time.monotonic() + args.ratio_seconds
    started = time.monotonic()

    def submitter(i: int) -> None:
        while time.monotonic() < stop:
            client.submit(unique_pdf(), settings=settings, metadata={"tenant": "bench"})
            done[i] += 1

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(args.submitters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pollers", type=int, default=200)
    parser.add_argument("--upload-rate", type=float, default=50.0)
    parser.add_argument("--max-in-flight", type=int, default=200)
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--ratio-seconds", type=float, default=10.0)
    parser.add_argument("--api-workers", type=int, default=2, help="uvicorn processes")
    parser.add_argument(
        "--status-seconds", type=float, default=5.0, help="status polls alone, for their CPU"
    )
    args = parser.parse_args()

    with ExitStack() as stack:
        env = stack.enter_context(services(stack))
        env = {**env, "OCRFLEET_API_RATE_PER_S": "1000000", "OCRFLEET_API_RATE_BURST": "1000000"}
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        key = ocrfleet_cli(env, "keys", "add", "bench").strip()
        port = free_port()
        base = f"http://127.0.0.1:{port}"  # loopback only
        argv = [sys.executable, "-m", "ocrfleet.cli", "api", "--port", str(port)]
        argv += ["--log-level", "warning", "--workers", str(args.api_workers)]
        stack.enter_context(process(argv, port, env=process_env(env)))
        (api_pid,) = [pid for pid in process_tree(os.getpid()) if b"api" in cmdline(pid)]
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

        first = httpx.post(
            f"{base}/v1/documents",
            headers={"Authorization": f"Bearer {key}"},
            files={"file": ("first.pdf", unique_pdf(), "application/pdf")},
            timeout=120,
        )
        first.raise_for_status()
        doc_id = first.json()["id"]

        print(
            f"mixed load {args.seconds:.0f} s: {args.pollers} status pollers, "
            f"{args.upload_rate:g} uploads/s offered"
        )
        cpu = CPU(process_tree(api_pid))
        stats = asyncio.run(mixed(base, key, doc_id, args, args.seconds, uploading=True))
        stats.report()
        uploads = stats.succeeded("upload")
        print(f"uploads accepted: {uploads} ({uploads / args.seconds:.1f}/s)")
        cpu.per_request("mixed load", sum(map(len, stats.latencies.values())))

        cpu = CPU(process_tree(api_pid))
        polls = asyncio.run(mixed(base, key, doc_id, args, args.status_seconds, uploading=False))
        cpu.per_request(f"status polls alone, {args.status_seconds:g} s", polls.succeeded("status"))

        cpu = CPU(process_tree(api_pid))
        api_rate, api_done = asyncio.run(api_submits(base, key, args))
        cpu.per_request("uploads alone", api_done)
        direct_rate = client_submits(env, args)
        print(f"submit throughput, {args.submitters} in flight: api {api_rate:.1f}/s, "
              f"client.submit {direct_rate:.1f}/s")
        print(f"ratio api/client submit: {api_rate / direct_rate:.2f}")


if __name__ == "__main__":
    main()
