"""Operator commands: `ocrfleet scheduler [explain]`, `ocrfleet beat`, `ocrfleet retry`,
`ocrfleet flower`.

`register(app)` adds them to the main CLI (ocrfleet/cli.py).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from ocrfleet.config import Settings
    from ocrfleet.scheduler.actuators import Actuator

scheduler_app = typer.Typer(
    no_args_is_help=False,
    invoke_without_command=True,
    help="Autoscale the fleet: read the signals, decide, act (see `explain`). Without "
    "--actuator it only reports what it would set.",
)

ACTUATORS = ("local", "celery", "kubernetes")


def _actuators(names: list[str], settings: Settings) -> list[Actuator]:
    import redis

    from ocrfleet.scheduler.actuators import CeleryPoolActuator, LocalActuator, MetricsOnlyActuator
    from ocrfleet.tasks.app import create_app

    found: list[Actuator] = []
    for name in names:
        if name == "local":
            found.append(LocalActuator(redis.Redis.from_url(settings.broker_url or "")))
        elif name == "celery":
            found.append(CeleryPoolActuator(create_app(settings)))
        elif name == "kubernetes":
            found += [MetricsOnlyActuator("gpu"), MetricsOnlyActuator("ingest")]
        else:
            raise ValueError(f"--actuator must be one of {ACTUATORS}, not {name!r}")
    roles = [a.role for a in found]
    if len(roles) != len(set(roles)):
        raise ValueError(f"two actuators for one pool: {roles}")
    return found


@scheduler_app.callback()
def scheduler(
    ctx: typer.Context,
    actuator: Annotated[
        list[str] | None,
        typer.Option(
            help="local (device launchers), celery (ingest pools), kubernetes (metrics); "
            "repeat for several",
            show_default="none: report what it would set, change nothing",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="log what the actuators would set; change nothing")
    ] = False,
    once: Annotated[bool, typer.Option(help="one tick, then exit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print decisions as JSON")] = False,
) -> None:
    """Run the scheduler loop (or one tick with `--once`; `--dry-run` ticks once too)."""
    if ctx.invoked_subcommand is not None:
        return
    from prometheus_client import start_http_server

    from ocrfleet.config import get_settings
    from ocrfleet.scheduler.loop import Scheduler

    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s: %(levelname)s/scheduler] %(message)s"
    )
    settings = get_settings()
    try:
        actuators = _actuators(actuator or [], settings)
        loop = Scheduler(settings, actuators, dry_run=dry_run)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if dry_run or once:
        _snapshot, decisions = loop.tick()
        for decision in decisions:
            if as_json:
                typer.echo(json.dumps(_decision_dict(decision, loop.dry_run), default=str))
            else:
                verb = "would set" if loop.dry_run else "set"
                typer.echo(
                    f"{decision.role}: {verb} {decision.desired} (now {decision.current}): "
                    f"{decision.reason}; inputs {json.dumps(decision.inputs, default=str)}"
                )
        return
    if settings.scheduler_metrics_port:
        start_http_server(settings.scheduler_metrics_port)
    if settings.broker_url:  # the recovery sweeps run here too when this one is elected
        from ocrfleet.tasks.sweeper import Sweeper

        Sweeper(settings).start()
    loop.run()


def _decision_dict(decision: Any, dry_run: bool) -> dict[str, Any]:
    return {
        "role": decision.role,
        "at": decision.at,
        "current": decision.current,
        "desired": decision.desired,
        "applied": not dry_run,
        "reason": decision.reason,
        "inputs": decision.inputs,
    }


@scheduler_app.command("explain")
def explain(
    limit: Annotated[int, typer.Option(help="how many decisions")] = 20,
    role: Annotated[str | None, typer.Option(help="gpu or ingest")] = None,
    changes: Annotated[bool, typer.Option(help="only decisions that changed a size")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
) -> None:
    """Print recent scaling decisions with the inputs they were made on."""
    from rich.console import Console
    from rich.table import Table

    from ocrfleet.config import get_settings
    from ocrfleet.scheduler.loop import recent_decisions

    rows = recent_decisions(get_settings().database_url, limit * (20 if changes else 1), role)
    if changes:
        rows = [r for r in rows if r.current != r.desired][:limit]
    if as_json:
        payload = [
            {
                "id": r.id,
                "decided_at": r.decided_at.isoformat(),
                "role": r.role,
                "actuator": r.actuator,
                "current": r.current,
                "desired": r.desired,
                "applied": r.applied,
                "reason": r.reason,
                "inputs": r.inputs,
            }
            for r in rows
        ]
        typer.echo(json.dumps(payload, indent=2))
        return
    columns = ("when", "pool", "size", "why", "backlog high+normal", "oldest s", "rate")
    table = Table(*columns, "startup s")
    for r in rows:
        inputs = r.inputs or {}
        ages = inputs.get("oldest_age_s") or {}
        oldest = max((a for a in ages.values() if a is not None), default=None)
        table.add_row(
            r.decided_at.strftime("%Y-%m-%d %H:%M:%S"),
            f"{r.role} ({r.actuator}{'' if r.applied else ', dry run'})",
            f"{r.current} -> {r.desired}" if r.current != r.desired else str(r.desired),
            r.reason,
            "{high}+{normal}".format(**{"high": 0, "normal": 0, **inputs.get("backlog", {})}),
            "" if oldest is None else f"{oldest:.0f}",
            f"{inputs.get('rate', 0):.2f}{'' if inputs.get('rate_measured') else '*'}",
            f"{inputs.get('startup_s', 0):.0f}{'' if inputs.get('startup_measured') else '*'}",
        )
    Console().print(table)
    typer.echo("* a default from the settings: no worker has reported its own yet")


def beat(
    loglevel: Annotated[str, typer.Option(help="log level")] = "info",
    schedule: Annotated[
        Path | None, typer.Option(hidden=True, help="ignored: the sweeps' last runs live in Redis")
    ] = None,
) -> None:
    """Run the recovery sweeps alone. Optional: every `ocrfleet worker` and `ocrfleet
    scheduler` runs them already; one process per fleet runs them (Redis lock)."""
    import signal

    from ocrfleet.config import get_settings
    from ocrfleet.tasks.sweeper import Sweeper

    del schedule
    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/sweeper] %(message)s"
    )
    settings = get_settings()
    if not settings.broker_url:
        typer.echo("error: OCRFLEET_BROKER_URL is not set: the sweeps need the broker", err=True)
        raise typer.Exit(2)
    sweeper = Sweeper(settings)
    signal.signal(signal.SIGTERM, lambda *_: sweeper.stop())
    try:
        sweeper.run()
    except KeyboardInterrupt:
        pass
    finally:
        sweeper.stop()


def retry(
    doc: Annotated[str | None, typer.Argument(help="document id, sha256 or path")] = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="every failed or partial document")
    ] = False,
    since: Annotated[
        datetime | None, typer.Option(help="with --failed: updated at or after (UTC)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
) -> None:
    """Re-queue failed pages with a fresh delivery budget (and documents that failed before
    they were split)."""
    from datetime import UTC

    from ocrfleet import client
    from ocrfleet.config import get_settings
    from ocrfleet.operations import retry as retry_failed

    if (doc is None) == (not failed):
        typer.echo("error: give a DOC or --failed (not both)", err=True)
        raise typer.Exit(2)
    ids = None
    if doc is not None:
        try:
            ids = [state.id for state in client.find(doc)]
        except LookupError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        if not ids:
            typer.echo(f"error: no document matches {doc!r}", err=True)
            raise typer.Exit(1)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    try:
        done = retry_failed(get_settings(), ids, since)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps([vars(r) for r in done]))
        return
    for r in done:
        what = "ingest" if r.ingest else f"{len(r.pages)} page(s)"
        typer.echo(f"{r.document_id}\tre-queued {what}")
    if not done:
        typer.echo("nothing to retry")


FLOWER_NO_CREDENTIALS = (
    "Flower refuses to start without credentials: set OCRFLEET_FLOWER_BASIC_AUTH=user:password, "
    "or OCRFLEET_FLOWER_AUTH (emails) with OCRFLEET_FLOWER_OAUTH_PROVIDER and "
    "FLOWER_OAUTH2_KEY/FLOWER_OAUTH2_SECRET/FLOWER_OAUTH2_REDIRECT_URI; or pass --no-auth"
)


def check_basic_auth(value: str) -> None:
    """Every comma-separated entry must be `user:password`, both non-empty: Flower compares
    the decoded `Authorization` header with the entry whole, so an entry without a colon
    would let in a header that carries no password at all. The value is never echoed."""
    for n, entry in enumerate(value.split(","), start=1):
        user, colon, password = entry.partition(":")
        if not (user.strip() and colon and password):
            raise ValueError(
                f"OCRFLEET_FLOWER_BASIC_AUTH entry {n} is not user:password with both set "
                "(a user without a password is refused)"
            )


def flower_env(settings: Settings, no_auth: bool) -> dict[str, str]:
    """Flower's own FLOWER_* options for these settings (credentials never on argv)."""
    from flower.utils.authentication import validate_auth_option

    env = {
        "FLOWER_PERSISTENT": "True",
        "FLOWER_DB": str(settings.flower_db),
        "FLOWER_STATE_SAVE_INTERVAL": "60000",  # ms: state survives a crash, not only a stop
    }
    if settings.flower_basic_auth:
        check_basic_auth(settings.flower_basic_auth)
        env["FLOWER_BASIC_AUTH"] = settings.flower_basic_auth
    elif settings.flower_auth:
        if not validate_auth_option(settings.flower_auth) or not settings.flower_oauth_provider:
            raise ValueError(
                f"OCRFLEET_FLOWER_AUTH={settings.flower_auth!r} needs "
                "OCRFLEET_FLOWER_OAUTH_PROVIDER and a pattern like '.*@example.com' (one '*', "
                "none in the domain) or 'a@x.com|b@y.com'"
            )
        env["FLOWER_AUTH"] = settings.flower_auth
        env["FLOWER_AUTH_PROVIDER"] = settings.flower_oauth_provider
    elif not no_auth:
        raise ValueError(FLOWER_NO_CREDENTIALS)
    return env


def flower(
    port: Annotated[int, typer.Option(help="HTTP port")] = 5555,
    address: Annotated[
        str, typer.Option(help="address to listen on; 0.0.0.0 to serve other hosts")
    ] = "127.0.0.1",
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="start without credentials (a trusted network)")
    ] = False,
) -> None:
    """Flower for the fleet's app: workers, tasks, queue lengths, /metrics (all behind the
    credentials, /metrics and /healthcheck included)."""
    import importlib.util
    import os
    import sys

    from ocrfleet.config import get_settings

    if importlib.util.find_spec("flower") is None:
        typer.echo(
            "error: `ocrfleet flower` needs Flower: pip install 'ocrfleet[monitoring]'", err=True
        )
        raise typer.Exit(2)
    settings = get_settings()
    try:
        if not settings.broker_url:
            raise ValueError("OCRFLEET_BROKER_URL is not set: Flower watches the broker")
        env = flower_env(settings, no_auth)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    argv = [sys.executable, "-m", "ocrfleet.flower_app", f"--port={port}", f"--address={address}"]
    os.execve(sys.executable, argv, {**os.environ, **env})


def register(app: typer.Typer) -> None:
    """Add `scheduler` (and `scheduler explain`), `beat`, `retry` and `flower`."""
    app.add_typer(scheduler_app, name="scheduler")
    app.command("beat")(beat)
    app.command("retry")(retry)
    app.command("flower")(flower)
