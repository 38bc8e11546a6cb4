"""Fleet commands: `ocrfleet worker`, `ocrfleet submit`, `ocrfleet status`.

`register(app)` adds them to the main typer app (ocrfleet/cli.py); `python -m
ocrfleet.fleet_cli ...` runs them alone. Only `worker` imports Celery's worker side; submit
and status go through `ocrfleet.client` and never import a model.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ocrfleet.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from ocrfleet.storage.local import display_uri

if TYPE_CHECKING:
    from ocrfleet import client

WORKER_HELP = "Start workers: one process per device for `gpu`, a CPU pool for `ingest`."


def worker(
    queues: Annotated[
        str,
        typer.Option(
            help="roles to consume, comma-separated: gpu, ingest, webhooks (ingest brings a "
            "webhooks child too)"
        ),
    ] = "gpu",
    devices: Annotated[
        str, typer.Option(help="auto | all | 0,2 | cpu:N (for the gpu role)")
    ] = "auto",
    concurrency: Annotated[
        int | None, typer.Option(help="pool processes of an ingest-only worker")
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option(help="extra modules the workers import (signal handlers)")
    ] = None,
    events: Annotated[bool, typer.Option(help="send task events (Flower, bench)")] = False,
    loglevel: Annotated[str, typer.Option(help="celery log level")] = "info",
    scaled: Annotated[
        bool, typer.Option(help="start none; run as many as `ocrfleet scheduler` asks for")
    ] = False,
    control_name: Annotated[
        str | None, typer.Option(help="this launcher's name on the control channel")
    ] = None,
) -> None:
    """Start and supervise the workers until SIGTERM/SIGINT (warm shutdown); run the
    fleet's recovery sweeps when this launcher is the one elected (Redis lock)."""
    from ocrfleet.config import get_settings
    from ocrfleet.tasks.app import celery_config
    from ocrfleet.tasks.control import ControlChannel, default_name
    from ocrfleet.tasks.devices import DeviceSpecError, parse_devices
    from ocrfleet.tasks.launcher import Supervisor, plan_children, with_monitoring
    from ocrfleet.tasks.sweeper import Sweeper

    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s: %(levelname)s/launcher] %(message)s"
    )
    settings = get_settings()
    roles = [role.strip() for role in queues.split(",") if role.strip()]
    try:
        celery_config(settings)  # refuse bad limits here, once, not in every child
        if not settings.broker_url:
            raise ValueError("OCRFLEET_BROKER_URL is not set: workers need a broker")
        device_list = parse_devices(devices) if "gpu" in roles else []
        specs = plan_children(
            roles,
            device_list,
            concurrency=concurrency,
            loglevel=loglevel,
            include=include or (),
            events=events,
            # A scaled launcher runs the slots the scheduler asks for: device workers only.
            webhook_threads=0 if scaled else settings.webhook_concurrency,
        )
        if scaled and "gpu" not in roles:
            raise ValueError("--scaled scales device workers: --queues must include gpu")
    except (ValueError, DeviceSpecError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if settings.worker_health_port:
        import tempfile

        root = tempfile.mkdtemp(prefix="ocrfleet-metrics-")
        specs = with_monitoring(specs, settings.worker_health_port, root)
    control = None
    if scaled:
        name = control_name or default_name("gpu")
        control = ControlChannel(settings.broker_url, name, "gpu", len(specs))
    # Every launcher is a candidate for the fleet's recovery sweeps; one runs them.
    sweeper = Sweeper(settings).start()
    try:
        code = Supervisor(specs, control=control).run()
    finally:
        sweeper.stop()
    raise typer.Exit(code)


def submit(
    paths: Annotated[list[str], typer.Argument(help="PDF or image files, or s3:// URIs")],
    wait: Annotated[
        bool, typer.Option("--wait", help="block until every document is finished")
    ] = False,
    priority: Annotated[str, typer.Option(help="high (interactive) or normal (bulk)")] = "normal",
    timeout: Annotated[float | None, typer.Option(help="seconds to --wait at most")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    redo_ocr: Annotated[
        bool | None,
        typer.Option(
            "--redo-ocr/--skip-text",
            help="submit under the run that OCRs every PDF page, or that reads good text "
            "layers (OCRFLEET_TEXT_LAYER; workers of that run read them)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Submit inputs to the fleet; prints each document id. An input that cannot be read is
    named on stderr and the others go on (exit 1)."""
    from ocrfleet import client
    from ocrfleet.config import get_settings

    settings = get_settings()
    if redo_ocr is not None:
        if settings.run_id is not None:
            message = "error: --redo-ocr/--skip-text choose a run; OCRFLEET_RUN_ID pins one"
            typer.echo(message, err=True)
            raise typer.Exit(2)
        settings = settings.model_copy(update={"text_layer": "redo" if redo_ocr else "use"})
    ids: list[int] = []
    submitted: list[str] = []
    unreadable = 0
    for path in paths:
        source = path if path.startswith(("s3://", "file://")) else Path(path)
        try:
            ids.append(client.submit(source, priority=priority, settings=settings))
            submitted.append(path)
        except client.UnreadableInput as exc:
            typer.echo(f"error: {exc}", err=True)
            unreadable += 1
        except (client.SubmitError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    states = _wait_with_progress(ids, timeout, quiet=as_json) if wait else None
    if as_json:
        rows = [_state_dict(s) for s in states] if states else [{"id": i} for i in ids]
        typer.echo(json.dumps(rows, indent=2))
    elif states:
        _print_table(states)
    else:
        for path, doc_id in zip(submitted, ids, strict=True):
            typer.echo(f"{doc_id}\t{display_uri(path)}")
    if unreadable or (states and _exit_code(states)):
        raise typer.Exit(1)


def _wait_with_progress(
    ids: list[int], timeout: float | None, *, quiet: bool
) -> list[client.DocumentState]:
    """Poll until every document is finished, with one bar over pages done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from ocrfleet import client

    deadline = None if timeout is None else time.monotonic() + timeout
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=quiet or not sys.stderr.isatty(),
        transient=False,
    ) as progress:
        bar = progress.add_task("pages", total=None)
        while True:
            states = [client.status(doc_id) for doc_id in ids]
            total = sum(s.page_count or 0 for s in states)
            done = sum(s.pages_done + s.pages_failed for s in states)
            finished = sum(1 for s in states if s.finished)
            progress.update(
                bar,
                total=total or None,
                completed=done,
                description=f"pages ({finished}/{len(ids)} documents finished)",
            )
            if finished == len(ids):
                return states
            if deadline is not None and time.monotonic() >= deadline:
                typer.echo(f"error: timed out after {timeout}s", err=True)
                raise typer.Exit(3)
            time.sleep(0.5)


def status(
    doc: Annotated[
        str | None, typer.Argument(help="document id, sha256 or path; omit for the latest 20")
    ] = None,
    show_all: Annotated[bool, typer.Option("--all", help="every document, newest first")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    stuck: Annotated[
        bool,
        typer.Option("--stuck", help="work left that has not moved for --age seconds, and why"),
    ] = False,
    age: Annotated[float, typer.Option(help="seconds, for --stuck")] = 600.0,
) -> None:
    """Show documents and their progress: the most recent ones, or those matching DOC.
    Exits 0 when every document shown is done or reviewed, 1 when one is not (failed,
    partial, rejected, cancelled, or not finished yet), 2 when DOC matches no document;
    with --stuck, 1 when anything is stuck."""
    from ocrfleet import client

    if stuck:
        raise typer.Exit(_print_stuck(age, as_json))

    try:
        states = client.recent(None if show_all else 20) if doc is None else client.find(doc)
    except LookupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from exc
    if doc is not None and not states:
        typer.echo(f"error: no document matches {display_uri(doc)!r}", err=True)
        raise typer.Exit(EXIT_USAGE)
    if as_json:
        typer.echo(json.dumps([_state_dict(s) for s in states], indent=2))
    else:
        _print_table(states)
    raise typer.Exit(_exit_code(states))


def _exit_code(shown: list[client.DocumentState]) -> int:
    """0 when every document shown is done or reviewed, else 1 (README: `ocrfleet status`)."""
    from ocrfleet.states import SUCCEEDED

    return EXIT_OK if all(s.status in SUCCEEDED for s in shown) else EXIT_FAILED


def _print_stuck(age: float, as_json: bool) -> int:
    from rich.console import Console
    from rich.table import Table

    from ocrfleet.config import get_settings
    from ocrfleet.operations import stuck

    items = stuck(get_settings(), age)
    if as_json:
        typer.echo(json.dumps([item.as_dict() for item in items], indent=2))
        return EXIT_FAILED if items else EXIT_OK
    table = Table("document", "page", "status", "unchanged", "deliveries", "where", "why")
    for item in items:
        table.add_row(
            str(item.document_id),
            "" if item.page is None else str(item.page),
            item.status,
            f"{item.age_s:.0f}s",
            "" if item.deliveries is None else str(item.deliveries),
            item.where,
            item.reason,
        )
    if items:
        Console(highlight=False).print(table)
        return EXIT_FAILED
    typer.echo(f"nothing unfinished unchanged for {age:.0f}s")
    return EXIT_OK


def _state_dict(state: client.DocumentState) -> dict[str, object]:
    return {
        "id": state.id,
        "status": state.status.value,
        "sha256": state.sha256,
        "source_uri": state.source_uri,
        "priority": state.priority,
        "page_count": state.page_count,
        "pages_done": state.pages_done,
        "pages_failed": state.pages_failed,
        "reason": state.reason,
        "meta": state.meta,
    }


def _print_table(states: list[client.DocumentState]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "status", "pages", "failed", "priority", "source")
    for s in states:
        name = (s.meta or {}).get("filename") or s.source_uri
        table.add_row(
            str(s.id),
            s.status.value,
            f"{s.pages_done}/{s.page_count if s.page_count is not None else '?'}",
            str(s.pages_failed),
            s.priority,
            display_uri(str(name)),
        )
    out = Console(highlight=False)
    out.print(table)
    for s in states:  # reasons on their own lines: readable at any width, and in a pipe
        if s.reason:
            out.print(f"  {s.id} {s.status.value}: {s.reason}", markup=False, overflow="fold")


def register(app: typer.Typer) -> None:
    """Add `worker`, `submit` and `status` to the main CLI."""
    app.command("worker", help=WORKER_HELP)(worker)
    app.command("submit")(submit)
    app.command("status")(status)


fleet_app = typer.Typer(add_completion=False, no_args_is_help=True)
register(fleet_app)

if __name__ == "__main__":
    fleet_app()
