"""The scheduler's Prometheus metrics: what it wants, what runs, and why.

`ocrfleet_scheduler_desired_workers` is what KEDA scales device workers on in Kubernetes
(infra/kubernetes/keda.yaml); the alert rules compare it with
`ocrfleet_scheduler_actual_workers`.
"""

from __future__ import annotations

from prometheus_client import Gauge

from ocrfleet.scheduler.policy import Decision
from ocrfleet.scheduler.signals import Snapshot

DESIRED = Gauge("ocrfleet_scheduler_desired_workers", "Workers the policy wants", ["role"])
ACTUAL = Gauge("ocrfleet_scheduler_actual_workers", "Workers heartbeating", ["role"])
WAITING = Gauge("ocrfleet_queue_waiting", "Messages waiting, sub-lists included", ["queue"])
UNACKED = Gauge("ocrfleet_queue_unacked", "Messages taken by a worker, not acknowledged", ["queue"])
BACKLOG = Gauge("ocrfleet_backlog", "Units waiting or in flight for a pool", ["role"])
OLDEST = Gauge(
    "ocrfleet_oldest_page_age_seconds", "Age of the oldest unfinished document", ["priority"]
)
PAGES = Gauge("ocrfleet_pages", "Pages by status", ["status"])
WORKER_RATE = Gauge(
    "ocrfleet_scheduler_worker_rate",
    "Units (pages, documents) one busy worker finishes per second, over the rate window",
    ["role"],
)
ARRIVALS = Gauge(
    "ocrfleet_scheduler_arrival_rate", "Units arriving per second, as the policy expects", ["role"]
)
UNSERVED = Gauge(
    "ocrfleet_scheduler_runs_without_worker",
    "Runs whose work waits while no live worker reads pages for them",
)
WORKER_LOAD = Gauge("ocrfleet_worker_model_load_seconds", "Measured at worker start", ["worker"])


def record(decision: Decision, actual: int) -> None:
    DESIRED.labels(decision.role).set(decision.desired)
    ACTUAL.labels(decision.role).set(actual)
    BACKLOG.labels(decision.role).set(sum(decision.inputs.get("backlog", {}).values()))
    WORKER_RATE.labels(decision.role).set(decision.inputs.get("rate", 0.0))
    ARRIVALS.labels(decision.role).set(decision.inputs.get("arrival_rate", 0.0))


def observe(snapshot: Snapshot) -> None:
    for name, queue in snapshot.queues.items():
        WAITING.labels(name).set(queue.waiting)
        UNACKED.labels(name).set(queue.unacked)
    for priority, age in snapshot.oldest_age_s.items():
        OLDEST.labels(priority).set(age or 0.0)
    for status, count in snapshot.pages.items():
        PAGES.labels(status).set(count)
    UNSERVED.set(len(snapshot.unserved_runs()))
    WORKER_LOAD.clear()
    for worker in snapshot.workers:
        if worker.load_s is not None:
            WORKER_LOAD.labels(worker.hostname).set(worker.load_s)
