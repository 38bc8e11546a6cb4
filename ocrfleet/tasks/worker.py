"""The worker's Celery entry point: `celery --app ocrfleet.tasks.worker worker ...`.

`connect(app, settings)` gives the app the broker transport that puts a message a worker
hands back at the head of its queue, and wires the lifecycle handlers (model loading,
heartbeat, health and metrics) in the order they run; importing this module connects them to
the app of the environment's settings, before the worker starts.
"""

from __future__ import annotations

import ssl

from celery import Celery

from ocrfleet.config import Settings, get_settings
from ocrfleet.tasks import broker, heartbeat, lifecycle, monitoring
from ocrfleet.tasks.app import create_app


def connect(app: Celery, settings: Settings) -> None:
    """Give `app` the workers' broker transport and connect the worker-side handlers, once
    per process however often it is called.

    Celery calls a signal's receivers in the order they were connected, so the order here
    is the order they run in: a pool child loads its models (lifecycle) before the
    heartbeat publishes the load time and the metrics record it."""
    # Only workers hand messages back; producers and Flower (which reads the URL's scheme
    # from the connection) keep kombu's own transport.
    if settings.broker_url:
        app.conf.broker_transport = broker.TRANSPORT
        if settings.broker_url.startswith("rediss://"):  # no TLS hint from the URL then
            app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    # Celery's worker signals are process-wide: one worker app per process.
    lifecycle.connect()
    heartbeat.connect(settings)
    monitoring.connect(settings)


settings = get_settings()
app = create_app(settings)
connect(app, settings)
