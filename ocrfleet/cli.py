"""`ocrfleet`: the command line. Exit codes: 0 all done, 1 some inputs rejected or failed,
2 usage error."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ocrfleet.config import get_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
console = Console(stderr=True)

INPUT_SUFFIXES = {".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp", ".bmp"}


def _usage_error(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(2)


def collect_inputs(paths: list[Path]) -> list[Path]:
    """Files as given, and folders searched recursively for inputs, in a stable order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and p.suffix.lower() in INPUT_SUFFIXES
            )
        elif path.is_file():
            found.append(path)
        else:
            raise _usage_error(f"no such file or directory: {path}")
    return found


@app.command()
def run(
    paths: Annotated[list[Path], typer.Argument(help="files or folders (recursive)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Process inputs in this process, on the embedded defaults unless configured otherwise."""
    from ocrfleet.report import document_summaries
    from ocrfleet.service import Context, ingest, process_page

    settings = get_settings()
    inputs = collect_inputs(paths)
    if not inputs:
        raise _usage_error("no PDF or image inputs found")
    _ensure_schema(settings.database_url)
    ctx = Context(settings)

    outcomes = []
    with console.status(f"splitting {len(inputs)} input(s)"):
        for path in inputs:
            outcomes.append(ingest(ctx, str(path.resolve())))
    pages = [page_id for outcome in outcomes for page_id in outcome.page_ids]

    started = time.monotonic()
    with Progress(
        TextColumn("pages"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.1f} pages/s"),
        TimeElapsedColumn(),
        console=console,
        disable=not pages,
    ) as progress:
        bar = progress.add_task("pages", total=len(pages), rate=0.0)
        for done, page_id in enumerate(pages, start=1):
            process_page(ctx, page_id)
            elapsed = time.monotonic() - started
            progress.update(bar, completed=done, rate=done / elapsed if elapsed else 0.0)

    with ctx.session() as session:
        rows = document_summaries(session, [o.document_id for o in outcomes])
    _print_summary(rows, [str(p) for p in inputs], as_json)
    if any(row.status not in ("done",) for row in rows):
        raise typer.Exit(1)


def _print_summary(rows: list, names: list[str], as_json: bool) -> None:
    if as_json:
        payload = [{"input": name, **row.as_dict()} for name, row in zip(names, rows, strict=True)]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    table = Table(title="ocrfleet run")
    for column in ("document", "id", "pages", "regions", "flagged", "mean conf", "status"):
        table.add_column(
            column, justify="left" if column == "document" else "right", overflow="fold"
        )
    for name, row in zip(names, rows, strict=True):
        name = _short(name)
        status = row.status if not row.reason else f"{row.status}: {row.reason}"
        conf = "" if row.mean_confidence is None else f"{row.mean_confidence:.3f}"
        table.add_row(
            name,
            str(row.document_id),
            str(row.pages),
            str(row.regions),
            str(row.flagged),
            conf,
            status,
        )
    Console().print(table)


def _short(path: str) -> str:
    """The path as the user would write it from here, or the file name if far away."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("../..") else Path(path).name


@app.command()
def results(
    doc: Annotated[str, typer.Argument(help="document id, input path or sha256")],
    fmt: Annotated[str, typer.Option("--format", help="text or json")] = "text",
) -> None:
    """Print a document's text in reading order, or its full structure."""
    from ocrfleet.db.session import session_scope
    from ocrfleet.report import document_json, document_text, resolve_document

    if fmt not in ("text", "json"):
        raise _usage_error(f"--format must be text or json, not {fmt!r}")
    settings = get_settings()
    _ensure_schema(settings.database_url)
    with session_scope(settings.database_url) as session:
        document_id = resolve_document(session, doc)
        if document_id is None:
            raise _usage_error(f"no document matches {doc!r}")
        if fmt == "text":
            sys.stdout.write(document_text(session, document_id) + "\n")
        else:
            sys.stdout.write(json.dumps(document_json(session, document_id), indent=2) + "\n")


@app.command()
def thresholds(
    dataset: Annotated[Path, typer.Argument(help="labelled JSONL: crop, text, category, label")],
    plot: Annotated[Path | None, typer.Option(help="also write a PNG plot here")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Auto-accept rate against precision of accepted text, per threshold."""
    from ocrfleet.thresholds import plot as plot_rows
    from ocrfleet.thresholds import run_thresholds

    if not dataset.is_file():
        raise _usage_error(f"no such dataset: {dataset}")
    rows = run_thresholds(dataset, get_settings())
    if as_json:
        sys.stdout.write(json.dumps([row._asdict() for row in rows], indent=2) + "\n")
    else:
        table = Table(title=f"thresholds for {dataset.name}")
        for column in ("threshold", "accept rate", "precision", "95% lower bound", "accepted"):
            table.add_column(column, justify="right")
        for row in rows:
            precision = "" if row.precision is None else f"{row.precision:.3f}"
            lower = "" if row.lower_bound is None else f"{row.lower_bound:.3f}"
            table.add_row(
                f"{row.threshold:.2f}",
                f"{row.accept_rate:.3f}",
                precision,
                lower,
                str(row.n_accepted),
            )
        Console().print(table)
        from ocrfleet.thresholds import shipped_threshold_lines

        for line in shipped_threshold_lines(get_settings()):
            console.print(line)
    if plot is not None:
        plot_rows(rows, plot)
        console.print(f"plot written to {plot}")


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Apply migrations to OCRFLEET_DATABASE_URL."""
    from ocrfleet.db.migrate import upgrade

    upgrade(get_settings().database_url, revision)
    console.print(f"database at {revision}")


@db_app.command("check")
def db_check() -> None:
    """Fail if the models and the migrations disagree."""
    from ocrfleet.db.migrate import check

    check(get_settings().database_url)
    console.print("no drift")


def _ensure_schema(url: str) -> None:
    """The embedded SQLite database migrates itself; a shared database is the operator's."""
    from ocrfleet.db.migrate import upgrade

    if url.startswith("sqlite"):
        upgrade(url)


# Fleet commands (`worker`, `submit`, `status`) live in fleet_cli; they import lazily.
from ocrfleet.fleet_cli import register as _register_fleet_commands  # noqa: E402

_register_fleet_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
