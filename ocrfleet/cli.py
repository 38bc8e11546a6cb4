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
    from ocrfleet.pipeline.rules import RulesError
    from ocrfleet.report import document_summaries
    from ocrfleet.service import Context, ingest, process_page

    settings = get_settings()
    inputs = collect_inputs(paths)
    if not inputs:
        raise _usage_error("no PDF or image inputs found")
    _ensure_schema(settings.database_url)
    ctx = Context(settings)
    try:
        ctx.rules  # noqa: B018  (a bad OCRFLEET_RULES file is a usage error, before any work)
    except RulesError as error:
        raise _usage_error(str(error)) from None

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
    if any(row.status not in ("done", "reviewed") for row in rows):
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
    fmt: Annotated[
        str, typer.Option("--format", help="text, json, markdown, hocr, alto or pdf")
    ] = "text",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="write here instead of stdout")
    ] = None,
) -> None:
    """Print (or write) a document's result in one of the output formats."""
    from ocrfleet.db.session import session_scope
    from ocrfleet.formats import FORMATS, render_document
    from ocrfleet.report import resolve_document
    from ocrfleet.storage import open_store

    if fmt not in FORMATS:
        raise _usage_error(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    settings = get_settings()
    _ensure_schema(settings.database_url)
    with session_scope(settings.database_url) as session:
        document_id = resolve_document(session, doc)
        if document_id is None:
            raise _usage_error(f"no document matches {doc!r}")
        store = open_store(settings) if fmt == "pdf" else None
        data = render_document(session, document_id, fmt, store)
    if output is not None:
        output.write_bytes(data)
    else:
        sys.stdout.buffer.write(data if data.endswith(b"\n") or fmt == "pdf" else data + b"\n")
        sys.stdout.flush()


@app.command()
def thresholds(
    dataset: Annotated[
        Path | None, typer.Argument(help="labelled JSONL: crop, text, category, label")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="also write a PNG plot here")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    from_reviews: Annotated[
        bool, typer.Option("--from-reviews", help="label with the reviewers' decisions instead")
    ] = False,
    category: Annotated[str | None, typer.Option(help="with --from-reviews: one category")] = None,
    precision: Annotated[
        float, typer.Option(help="with --from-reviews: the target precision of a proposal")
    ] = 0.99,
) -> None:
    """Auto-accept rate against precision of accepted text, per threshold."""
    from ocrfleet.thresholds import plot as plot_rows
    from ocrfleet.thresholds import run_thresholds

    if from_reviews:
        if dataset is not None:
            raise _usage_error("give a DATASET or --from-reviews, not both")
        _thresholds_from_reviews(category, precision, as_json)
        return
    if dataset is None:
        raise _usage_error("give a labelled DATASET, or --from-reviews")
    if not dataset.is_file():
        raise _usage_error(f"no such dataset: {dataset}")
    rows = run_thresholds(dataset, get_settings())
    if as_json:
        sys.stdout.write(json.dumps([row._asdict() for row in rows], indent=2) + "\n")
    else:
        Console().print(_threshold_table(f"thresholds for {dataset.name}", rows))
    if plot is not None:
        plot_rows(rows, plot)
        console.print(f"plot written to {plot}")


def _threshold_table(title: str, rows: list) -> Table:
    table = Table(title=title)
    for column in ("threshold", "accept rate", "precision", "accepted"):
        table.add_column(column, justify="right")
    for row in rows:
        precision = "" if row.precision is None else f"{row.precision:.3f}"
        table.add_row(
            f"{row.threshold:.2f}", f"{row.accept_rate:.3f}", precision, str(row.n_accepted)
        )
    return table


def _thresholds_from_reviews(category: str | None, target: float, as_json: bool) -> None:
    from ocrfleet.db.session import session_scope
    from ocrfleet.review.calibrate import propose
    from ocrfleet.review.reviewed import reviewed_regions

    if category is not None and category not in ("text", "formula", "table"):
        raise _usage_error(f"--category must be text, formula or table, not {category!r}")
    if not 0.0 < target <= 1.0:
        raise _usage_error("--precision must be in (0, 1]")
    settings = get_settings()
    _ensure_schema(settings.database_url)
    with session_scope(settings.database_url) as session:
        proposals = propose(reviewed_regions(session, category=category), target)
    if not proposals:
        raise _usage_error("no reviewed regions yet: work the review queue first")
    if as_json:
        payload = [
            {
                "category": p.category,
                "regions": p.regions,
                "correct": p.correct,
                "target_precision": p.target,
                "proposed": None if p.proposed is None else p.proposed._asdict(),
                "rows": [row._asdict() for row in p.rows],
            }
            for p in proposals
        ]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    for p in proposals:
        title = f"{p.category}: {p.regions} reviewed regions, {p.correct} read right"
        Console().print(_threshold_table(title, p.rows))
        if p.proposed is None:
            console.print(f"{p.category}: no threshold reaches precision {p.target}")
        else:
            console.print(
                f"{p.category}: proposed threshold {p.proposed.threshold:.4f} "
                f"(accept rate {p.proposed.accept_rate:.3f}, precision "
                f"{p.proposed.precision:.3f} at target {p.target}); "
                f"set OCRFLEET_THRESHOLD_{p.category.upper()}"
            )


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
from ocrfleet.repro_cli import register as _register_repro  # noqa: E402

_register_repro(app)

from ocrfleet.ops_cli import register as _register_ops_commands  # noqa: E402

_register_ops_commands(app)

# Back-office commands (`review`, `users`, `export`) live in ocrfleet/review/cli.py.
from ocrfleet.review.cli import register as _register_review_commands  # noqa: E402

_register_review_commands(app)

from ocrfleet.api_cli import register as _register_api_commands  # noqa: E402

_register_api_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
