"""`ocrfleet worker`: one Celery worker process per device, supervised.

Each child is a plain `celery worker` (prefork pool, one pool process, see
`ocrfleet.tasks.app` for why prefork rather than solo) started with fork+exec and
`CUDA_VISIBLE_DEVICES` naming its one device, and a hostname naming it (`gpu0@host`).
The launcher restarts a child that exits with exponential backoff, forwards SIGTERM/SIGINT
for a warm shutdown (the page in flight finishes, unstarted ones go back to the queue; a
second signal asks for a cold one) and gives up, exiting non-zero, when a child keeps
dying right after start (a configuration error such as a missing model path).

With a control channel (`ocrfleet worker --scaled`, see `ocrfleet.tasks.control`) the
launcher starts with no worker running and follows the number the scheduler sets: the
first N device slots run, the others are stopped with a warm shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ocrfleet.memory import huge_pages_env
from ocrfleet.tasks import routing
from ocrfleet.tasks.control import ControlChannel
from ocrfleet.tasks.devices import Device, thread_share

log = logging.getLogger(__name__)

CELERY_APP = "ocrfleet.tasks.worker"


@dataclass(frozen=True)
class ChildSpec:
    """How to start one worker process."""

    name: str  # "gpu0", "cpu1", "ingest": the hostname's node part
    argv: list[str]
    env: dict[str, str]  # overrides on top of the launcher's environment


def celery_argv(
    *,
    queues: Sequence[str],
    name: str,
    concurrency: int,
    loglevel: str = "info",
    include: Sequence[str] = (),
    events: bool = False,
    pool: str = "prefork",
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "--app",
        CELERY_APP,
        "worker",
        "--queues",
        ",".join(queues),
        "--hostname",
        f"{name}@%h",
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--prefetch-multiplier",
        "1",
        "--loglevel",
        loglevel,
        "--without-mingle",  # no revokes to sync; starts a second sooner
        "--without-gossip",
    ]
    if include:
        argv += ["--include", ",".join(include)]
    if events:
        argv.append("--task-events")
    return argv


def plan_children(
    roles: Sequence[str],
    devices: Sequence[Device],
    *,
    concurrency: int | None = None,
    loglevel: str = "info",
    include: Sequence[str] = (),
    events: bool = False,
    webhook_threads: int = 0,
) -> list[ChildSpec]:
    """Children for `ocrfleet worker --queues ROLES --devices ...`.

    With the `gpu` role: one child per device, one pool process each, consuming the page
    queues (and `ingest` when asked for too). With `ingest` alone: one child without a GPU
    whose pool has `concurrency` processes (default: every CPU). With `ingest` or
    `webhooks` and `webhook_threads`: one more child, `webhooks`, whose pool of that many
    threads consumes only the webhook queue (deliveries wait on receivers, not the CPU)."""
    roles = [role.strip() for role in roles if role.strip()]
    webhooks = webhook_threads > 0 and ("ingest" in roles or routing.WEBHOOK_QUEUE in roles)
    roles = [role for role in roles if role != routing.WEBHOOK_QUEUE]
    children = [_webhook_child(webhook_threads, loglevel, include, events)] if webhooks else []
    if not roles and children:
        return children
    return (
        _role_children(
            roles,
            devices,
            concurrency=concurrency,
            loglevel=loglevel,
            include=include,
            events=events,
        )
        + children
    )


def _webhook_child(threads: int, loglevel: str, include: Sequence[str], events: bool) -> ChildSpec:
    argv = celery_argv(
        queues=[routing.WEBHOOK_QUEUE],
        name="webhooks",
        concurrency=threads,
        loglevel=loglevel,
        include=include,
        events=events,
        pool="threads",
    )
    return ChildSpec("webhooks", argv, {"CUDA_VISIBLE_DEVICES": ""})


def _role_children(
    roles: Sequence[str],
    devices: Sequence[Device],
    *,
    concurrency: int | None,
    loglevel: str,
    include: Sequence[str],
    events: bool,
) -> list[ChildSpec]:
    queues = routing.consume_order(roles)
    if "gpu" not in roles:
        processes = concurrency or os.cpu_count() or 1
        argv = celery_argv(
            queues=queues,
            name="ingest",
            concurrency=processes,
            loglevel=loglevel,
            include=include,
            events=events,
        )
        return [ChildSpec("ingest", argv, {"CUDA_VISIBLE_DEVICES": ""})]
    share = str(thread_share(devices))
    children = []
    for device in devices:
        env = dict(device.env)
        if device.kind == "cpu":  # N CPU workers split the cores instead of fighting over them
            for var in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT", "OCRFLEET_ONNX_THREADS"):
                env[var] = os.environ.get(var, share)
        argv = celery_argv(
            queues=queues,
            name=device.name,
            concurrency=1,
            loglevel=loglevel,
            include=include,
            events=events,
        )
        children.append(ChildSpec(device.name, argv, env))
    return children


def with_monitoring(specs: Sequence[ChildSpec], base_port: int, root: str) -> list[ChildSpec]:
    """Give each child its own /healthz /readyz /metrics port (base + slot) and its own
    prometheus multiprocess folder under `root` (wiped at every start)."""
    out = []
    for slot, spec in enumerate(specs):
        env = {
            **spec.env,
            "OCRFLEET_WORKER_HEALTH_PORT": str(base_port + slot),
            "PROMETHEUS_MULTIPROC_DIR": os.path.join(root, spec.name),
        }
        out.append(ChildSpec(spec.name, spec.argv, env))
    return out


def _wipe(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))


@dataclass
class _Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures_in_a_row: int = 0
    restart_at: float | None = None
    restarts: int = field(default=0)
    wanted: bool = True  # the control channel wants this slot running
    stopping: bool = False  # asked to stop by the control channel


try:  # imported here, not between fork and exec: the launcher runs the sweeper thread too
    from billiard.util import set_pdeathsig
except ImportError:  # pragma: no cover - billiard comes with celery
    set_pdeathsig = None


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM (a warm shutdown) if the launcher dies."""
    try:
        if set_pdeathsig is not None:
            set_pdeathsig(signal.SIGTERM)
    except Exception:  # not Linux: the child just outlives a killed launcher
        pass


class Supervisor:
    """Start the children, keep them running, stop them gently."""

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        stable_after_s: float = 60.0,
        max_failures_in_a_row: int = 5,
        poll_s: float = 0.2,
        control: ControlChannel | None = None,
        control_poll_s: float = 1.0,
    ) -> None:
        if not specs:
            raise ValueError("nothing to supervise")
        self.children = [_Child(spec, wanted=control is None) for spec in specs]
        self.control = control
        self.control_poll_s = control_poll_s
        self._control_at = 0.0
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.max_failures_in_a_row = max_failures_in_a_row
        self.poll_s = poll_s
        self._stop_signals = 0
        self._gave_up: str | None = None

    # -- signals ---------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signals += 1
        # First signal: warm shutdown (SIGTERM to each child). Second: cold (SIGQUIT).
        forward = signal.SIGTERM if self._stop_signals == 1 else signal.SIGQUIT
        log.info(
            "%s: %s shutdown of %d worker(s)",
            signal.Signals(signum).name,
            "warm" if forward == signal.SIGTERM else "cold",
            len(self.children),
        )
        self._send_all(forward)

    def _send_all(self, signum: int) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signum)

    # -- children --------------------------------------------------------------------
    def _start(self, child: _Child) -> None:
        env = huge_pages_env({**os.environ, **child.spec.env})
        if "PROMETHEUS_MULTIPROC_DIR" in child.spec.env:  # counters restart with the process
            _wipe(child.spec.env["PROMETHEUS_MULTIPROC_DIR"])
        child.proc = subprocess.Popen(
            child.spec.argv, env=env, preexec_fn=_die_with_parent, start_new_session=True
        )
        child.started_at = time.monotonic()
        child.restart_at = None
        log.info(
            "started worker %s (pid %s, CUDA_VISIBLE_DEVICES=%r)",
            child.spec.name,
            child.proc.pid,
            env.get("CUDA_VISIBLE_DEVICES"),
        )

    def _on_exit(self, child: _Child, code: int, now: float) -> None:
        lived = now - child.started_at
        child.failures_in_a_row = 0 if lived >= self.stable_after_s else child.failures_in_a_row + 1
        child.proc = None
        if child.failures_in_a_row >= self.max_failures_in_a_row:
            self._gave_up = (
                f"worker {child.spec.name} exited {child.failures_in_a_row} times in a row "
                f"within {self.stable_after_s:.0f}s of starting (last exit code {code})"
            )
            return
        delay = min(
            self.backoff_max_s,
            self.backoff_initial_s * 2 ** max(0, child.failures_in_a_row - 1),
        )
        child.restart_at = now + delay
        child.restarts += 1
        log.warning(
            "worker %s exited with %s after %.1fs; restarting in %.1fs",
            child.spec.name,
            code,
            lived,
            delay,
        )

    def _alive(self) -> list[_Child]:
        return [child for child in self.children if child.proc is not None]

    def _follow_control(self, now: float) -> None:
        """Run the first N slots the scheduler asks for; warm-stop the rest."""
        if self.control is None or now < self._control_at:
            return
        self._control_at = now + self.control_poll_s
        running = sum(1 for c in self.children if c.proc is not None and not c.stopping)
        desired = self.control.poll(running)
        for index, child in enumerate(self.children):
            wanted = index < desired
            if wanted and not child.wanted:
                child.failures_in_a_row = 0
            child.wanted = wanted
            if not wanted and child.proc is not None and not child.stopping:
                log.info("scaling down: warm shutdown of worker %s", child.spec.name)
                child.stopping = True
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
            if not wanted:
                child.restart_at = None

    def run(self) -> int:
        """Block until stopped by a signal (0) or until a child keeps failing (1)."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for child in self.children:
                if child.wanted:
                    self._start(child)
            while True:
                now = time.monotonic()
                if not self._stop_signals:
                    self._follow_control(now)
                for child in self.children:
                    if child.proc is not None and (code := child.proc.poll()) is not None:
                        if self._stop_signals or child.stopping:
                            child.proc, child.stopping = None, False
                            log.info("worker %s stopped (exit %s)", child.spec.name, code)
                        else:
                            self._on_exit(child, code, now)
                    elif (
                        child.proc is None
                        and child.wanted
                        and (child.restart_at is None or now >= child.restart_at)
                        and not self._stop_signals
                        and self._gave_up is None
                    ):
                        self._start(child)
                if self._gave_up is not None and not self._stop_signals:
                    log.error("giving up: %s", self._gave_up)
                    self._stop_signals = 1
                    self._send_all(signal.SIGTERM)
                if self._stop_signals and not self._alive():
                    return 1 if self._gave_up else 0
                time.sleep(self.poll_s)
        finally:
            if self.control is not None:
                self.control.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
