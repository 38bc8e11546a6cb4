"""The process `ocrfleet flower` becomes: Flower for the fleet's Celery app, with its
`/metrics` and `/healthcheck` behind the same credentials as every other page (Flower
serves both to anyone; its metrics name every worker, task and queue)."""

from __future__ import annotations

import sys


def guard_monitor_routes() -> None:
    """Require a logged-in user (basic auth or OAuth, whichever Flower is set up with) on
    the two handlers Flower leaves open; `--no-auth` still opens them, as it opens all."""
    from flower.views import monitor
    from tornado import web

    for handler in (monitor.Metrics, monitor.Healthcheck):
        if not getattr(handler.get, "__wrapped__", None):
            handler.get = web.authenticated(handler.get)  # type: ignore[method-assign]


def main() -> None:
    """`celery --app ocrfleet.tasks.app flower ARGS...` with the guarded routes."""
    from celery.bin.celery import main as celery_main

    guard_monitor_routes()
    sys.argv = ["celery", "--app", "ocrfleet.tasks.app", "flower", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
