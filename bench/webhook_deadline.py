"""How long one webhook attempt holds its worker when the receiver drips its answer, against
the per-read timeout webhooks had before (issue 18, finding 3): prints seconds held and the
ratio to OCRFLEET_WEBHOOK_TIMEOUT_S for each.

    python bench/webhook_deadline.py [--timeout 2] [--interval 0.25] [--bytes 120]

The receiver (a socket server on 127.0.0.1) reads the request, then sends
`HTTP/1.1 200 OOO…` one byte every `--interval` seconds. `deadline` is
`ocrfleet.outbound.post` (resolve, connect, send and status line under one deadline);
`per-read` is httpx with the same number as its timeout, which bounds each read, not the
attempt, so it waits out the whole drip.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

import httpx

from ocrfleet import outbound


def drip_server(answer: bytes, interval: float) -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def handle(conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            try:
                for i in range(len(answer)):
                    conn.sendall(answer[i : i + 1])
                    time.sleep(interval)
            except OSError:
                return  # the client hung up

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=2.0, help="OCRFLEET_WEBHOOK_TIMEOUT_S")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds per byte")
    parser.add_argument("--bytes", type=int, default=120, help="length of the dripped reason")
    args = parser.parse_args()
    answer = b"HTTP/1.1 200 " + b"O" * args.bytes + b"\r\nContent-Length: 0\r\n\r\n"
    listener, port = drip_server(answer, args.interval)
    url = f"http://127.0.0.1:{port}/hook"
    print(f"receiver drips {len(answer)} bytes at {args.interval}s each "
          f"({len(answer) * args.interval:.0f}s); timeout {args.timeout}s")

    started = time.monotonic()
    deadline = started + args.timeout
    try:
        target = outbound.resolve(url, allow_private=True, deadline=deadline)
        outcome = str(outbound.post(target, b"{}", {}, deadline=deadline))
    except (outbound.DeadlineExceeded, OSError, ValueError) as exc:
        outcome = type(exc).__name__
    held = time.monotonic() - started
    print(f"deadline   held {held:6.1f}s  ratio {held / args.timeout:5.2f}  -> {outcome}")

    started = time.monotonic()
    try:
        outcome = str(httpx.post(url, content=b"{}", timeout=args.timeout).status_code)
    except httpx.HTTPError as exc:
        outcome = type(exc).__name__
    held = time.monotonic() - started
    print(f"per-read   held {held:6.1f}s  ratio {held / args.timeout:5.2f}  -> {outcome}")
    listener.close()


if __name__ == "__main__":
    main()
