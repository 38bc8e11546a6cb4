"""`ocrfleet`: the command line.

Exit codes, the same for every command: 0 all done; 1 some input rejected, or some
document or page failed; 2 usage or configuration error (one line, nothing processed);
3 internal error of ocrfleet (one line; the traceback is in OCRFLEET_CACHE_DIR/ocrfleet.log).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ocrfleet import errors
from ocrfleet.config import get_settings
from ocrfleet.storage.local import display_uri

if TYPE_CHECKING:
    from ocrfleet.service import Context

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help=__doc__,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
console = Console(stderr=True)
log = logging.getLogger("ocrfleet")

INPUT_SUFFIXES = {".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".webp", ".bmp"}
LOG_NAME = "ocrfleet.log"


def _usage_error(message: str) -> typer.Exit:
    console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(errors.EXIT_USAGE)


def collect_inputs(
    paths: list[Path], ignore: tuple[Path, ...] = ()
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(inputs, skipped with why): files as given, and folders searched recursively for
    PDFs and images in a stable order. In folders, links are not followed (so no loop can
    form), and other types, special files, unreadable folders and `ignore` (ocrfleet's own
    store and cache) are skipped and named."""
    found: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    ignored = {p.resolve() for p in ignore}
    for path in paths:
        if path.is_dir():
            _walk(path, found, skipped, ignored)
        elif path.is_file():
            found.append(path)
        elif path.exists() or path.is_symlink():
            raise _usage_error(f"not a file or directory: {display_uri(str(path))}")
        else:
            raise _usage_error(f"no such file or directory: {display_uri(str(path))}")
    return found, skipped


def _walk(
    folder: Path, found: list[Path], skipped: list[tuple[Path, str]], ignored: set[Path]
) -> None:
    def refuse(error: OSError) -> None:
        skipped.append((Path(error.filename), "cannot list the folder: permission denied"))

    for dirpath, dirnames, filenames in os.walk(folder, onerror=refuse):
        here = Path(dirpath)
        for name in sorted(dirnames):
            sub = here / name
            if sub.is_symlink():
                skipped.append((sub, "link to a folder: not followed"))
                dirnames.remove(name)
            elif sub.resolve() in ignored:
                dirnames.remove(name)
        dirnames.sort()
        for name in sorted(filenames):
            path = here / name
            try:
                mode = path.lstat().st_mode
            except OSError:
                skipped.append((path, "vanished while listing"))
                continue
            if stat.S_ISLNK(mode):
                skipped.append((path, "link: not followed"))
            elif not stat.S_ISREG(mode):
                skipped.append((path, "not a regular file"))
            elif path.suffix.lower() not in INPUT_SUFFIXES:
                skipped.append((path, f"unsupported type {path.suffix or '(no extension)'}"))
            else:
                found.append(path)


@app.command()
def run(
    paths: Annotated[list[Path], typer.Argument(help="files or folders (recursive)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs", "-j", min=1, help="pages read at once, in worker processes [default: CPUs]"
        ),
    ] = None,
    redo_ocr: Annotated[
        bool | None,
        typer.Option(
            "--redo-ocr/--skip-text",
            help="OCR every PDF page, or read a page with a good text layer from it, verified "
            "(OCRFLEET_TEXT_LAYER; default: skip-text)",
            show_default=False,
        ),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="also write each done input's result here, as <name>.<suffix> in --format",
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option("--format", help="with --output-dir: text, json, markdown, hocr, alto or pdf"),
    ] = "pdf",
) -> None:
    """Process inputs on this machine, on the embedded defaults unless configured otherwise.

    Pages are read in `--jobs` worker processes (default: the CPUs this process may use),
    with the same results as one job. Every input ends done, rejected (with a reason) or
    failed (with a reason); one bad input or page never stops the run. With `--output-dir`,
    each input that ends done is also written there (by default a searchable PDF, as
    `ocrfleet results --format pdf` writes it), in the same process: no second command."""
    from ocrfleet.formats import FORMATS
    from ocrfleet.memory import PeakRss
    from ocrfleet.parallel import available_cpus, run_pages
    from ocrfleet.pipeline.rules import RulesError
    from ocrfleet.pipeline.sandbox import close_idle
    from ocrfleet.report import document_summaries
    from ocrfleet.service import Context, ingest, record_unreadable
    from ocrfleet.states import SUCCEEDED
    from ocrfleet.storage import StorageError
    from ocrfleet.storage.local import storable_uri

    if fmt not in FORMATS:
        raise _usage_error(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if output_dir is not None:
        if output_dir.exists() and not output_dir.is_dir():
            raise _usage_error(f"--output-dir {output_dir} exists and is not a folder")
        output_dir.mkdir(parents=True, exist_ok=True)
    settings = get_settings()
    if redo_ocr is not None:
        settings = settings.model_copy(update={"text_layer": "redo" if redo_ocr else "use"})
    jobs = jobs or available_cpus()
    ignore = (settings.cache_dir,)
    if settings.store_url.startswith("file://"):
        from ocrfleet.storage.local import file_uri_to_path

        ignore += (file_uri_to_path(settings.store_url),)
    inputs, skipped = collect_inputs(paths, ignore)
    if not inputs:
        _print_skipped(skipped)
        raise _usage_error("no PDF or image inputs found")
    _ensure_schema(settings.database_url)
    ctx = Context(settings)
    try:
        ctx.rules  # noqa: B018  (a bad OCRFLEET_RULES file is a usage error, before any work)
    except RulesError as error:
        raise _usage_error(str(error)) from None
    ctx.own_run_id  # noqa: B018  (computed and checked against a pin before any work)

    with PeakRss() as peak:
        started = time.monotonic()
        outcomes = []
        warmup = _Warmup(ctx, jobs)
        with console.status(f"splitting {len(inputs)} input(s)"):
            for path in inputs:
                uri = storable_uri(str(path.absolute()))
                try:
                    outcomes.append(ingest(ctx, uri, on_split=warmup.opened))
                except StorageError as exc:  # vanished, no permission, an I/O error
                    outcomes.append(record_unreadable(ctx, uri, exc))
        close_idle()  # the renderer's memory is the pages' now
        warmup.wait()
        pages = [page_id for outcome in outcomes for page_id in outcome.page_ids]
        with _PageProgress(len(pages)) as progress:
            run_pages(ctx, pages, jobs, progress.done, warmup.workers)
        seconds = time.monotonic() - started

    with ctx.session() as session:
        rows = document_summaries(session, [o.document_id for o in outcomes])
    names = [display_uri(str(p)) for p in inputs]
    _print_summary(rows, names, skipped, as_json)
    stats = RunStats(len(pages), min(jobs, max(1, len(pages))), seconds, peak.peak_mb)
    _print_stats(stats, as_json)
    if output_dir is not None:
        ctx.drop_models()  # the page images and fonts of the outputs take their place
        done = [
            (path, row.document_id)
            for path, row in zip(inputs, rows, strict=True)
            if row.status in SUCCEEDED
        ]
        written = _write_results(ctx, done, output_dir, fmt)
        console.print(
            f"wrote {len(written)} of {len(inputs)} input(s) as {fmt} to {output_dir}", markup=False
        )
    if any(row.status not in SUCCEEDED for row in rows):
        raise typer.Exit(errors.EXIT_FAILED)


class _Warmup:
    """What reads the pages, made ready while the inputs are split, from the first input new
    to the run (a run with nothing to read starts nothing). With one job, this process's
    models, loaded in a thread: the split waits on its renderer child, so the two overlap;
    a model that fails to load here fails again, with its reason, when the first page asks
    for it. With N jobs, the N worker processes, once the inputs opened so far have N pages
    (a run of fewer pages is read in fewer workers, or in this process)."""

    def __init__(self, ctx: Context, jobs: int) -> None:
        from ocrfleet.parallel import Workers

        self.ctx, self.jobs, self.pages = ctx, jobs, 0
        self.thread: threading.Thread | None = None
        self.workers = Workers(ctx.settings, jobs) if jobs > 1 else None

    def opened(self, pages: int) -> None:
        self.pages += pages
        if self.workers is not None:
            if self.pages >= self.jobs:
                self.workers.start()
        elif self.thread is None:
            self.thread = threading.Thread(target=self._load, name="ocrfleet-models", daemon=True)
            self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def _load(self) -> None:
        with contextlib.suppress(Exception):
            self.ctx.toolkit  # noqa: B018


def _write_results(
    ctx: Context, done: list[tuple[Path, int]], folder: Path, fmt: str
) -> list[Path]:
    """Each input's result as `folder/<input's stem><format's suffix>`; an input whose name
    another input already took there gets its document id too (`<stem>-<id>`)."""
    from ocrfleet.formats import SUFFIXES, render_document

    store = ctx.store if fmt == "pdf" else None
    written: list[Path] = []
    with ctx.session() as session:
        for path, document_id in done:
            target = folder / f"{path.stem}{SUFFIXES[fmt]}"
            if target in written:
                target = folder / f"{path.stem}-{document_id}{SUFFIXES[fmt]}"
            target.write_bytes(render_document(session, document_id, fmt, store))
            written.append(target)
    return written


class _PageProgress:
    """Pages done so far: a live bar on a terminal; elsewhere (a log, CI) a line at every
    tenth of the pages and at least every minute, so a long run shows it is alive."""

    def __init__(self, total: int) -> None:
        self.total, self.count = total, 0
        self.started = self.said_at = time.monotonic()
        self.bar = Progress(
            TextColumn("pages"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.1f} pages/min"),
            TimeElapsedColumn(),
            console=console,
            disable=not total or not console.is_terminal,
        )
        self.task = self.bar.add_task("pages", total=total, rate=0.0)

    def __enter__(self) -> _PageProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)  # type: ignore[arg-type]

    def done(self, _page_id: int, _status: object) -> None:
        self.count += 1
        now = time.monotonic()
        rate = 60 * self.count / max(now - self.started, 1e-9)
        self.bar.update(self.task, completed=self.count, rate=rate)
        step = max(1, self.total // 10)
        if console.is_terminal or not (self.count % step == 0 or now - self.said_at >= 60):
            return
        self.said_at = now
        console.print(f"pages {self.count}/{self.total} ({rate:.1f} pages/min)", markup=False)


@dataclass(frozen=True)
class RunStats:
    """What a run cost: pages read, worker processes, wall seconds (split included) and the
    peak resident memory of this process and its workers together."""

    pages: int
    jobs: int
    seconds: float
    peak_rss_mb: float

    def as_dict(self) -> dict[str, float | int]:
        per_min = 60 * self.pages / self.seconds if self.seconds else 0.0
        return {
            "pages": self.pages,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 2),
            "pages_per_min": round(per_min, 2),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
        }


def _print_stats(stats: RunStats, as_json: bool) -> None:
    """One line on stderr; with --json it is `run: {...}` (stdout keeps the documents)."""
    if as_json:
        console.print(f"run: {json.dumps(stats.as_dict())}", markup=False, soft_wrap=True)
        return
    values = stats.as_dict()
    Console(highlight=False).print(
        f"{stats.pages} page(s) in {values['seconds']} s with {stats.jobs} job(s) "
        f"({values['pages_per_min']} pages/min), peak memory {values['peak_rss_mb']:.0f} MB",
        markup=False,
    )


def _print_summary(
    rows: list, names: list[str], skipped: list[tuple[Path, str]], as_json: bool
) -> None:
    if as_json:
        payload = [{"input": name, **row.as_dict()} for name, row in zip(names, rows, strict=True)]
        skips = [{"path": display_uri(str(p)), "why": why} for p, why in skipped]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        if skips:
            console.print(
                f"skipped {len(skips)} file(s): {json.dumps(skips)}", markup=False, soft_wrap=True
            )
        _print_review_hint(rows, console)
        return
    out = Console(highlight=False)
    table = Table(title="ocrfleet run", title_justify="left")
    for column in ("document", "id", "pages", "regions", "flagged", "conf", "status"):
        table.add_column(
            column,
            justify="left" if column in ("document", "status") else "right",
            overflow="fold",
        )
    for name, row in zip(names, rows, strict=True):
        conf = "" if row.mean_confidence is None else f"{row.mean_confidence:.3f}"
        table.add_row(
            _short(name),
            str(row.document_id),
            f"{row.pages_done}/{row.pages}" if row.pages else "0",
            str(row.regions),
            str(row.flagged),
            conf,
            row.status,
        )
    out.print(table)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    totals = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    out.print(f"{len(rows)} input(s): {totals}", markup=False)
    _print_review_hint(rows, out)
    for name, row in zip(names, rows, strict=True):
        if row.status != "done":
            out.print(f"  {row.status} {_short(name)} (id {row.document_id})", markup=False)
            for reason in row.reasons:
                out.print(f"      {reason}", markup=False, overflow="fold")
    _print_skipped(skipped, out)


def _print_review_hint(rows: list, out: Console) -> None:
    """How many regions wait for a person, and where to open them: the text is not
    verified until then (the JSON rows carry `awaiting_review` and `review_path`)."""
    waiting = {row.document_id: row for row in rows if row.awaiting_review}
    if not waiting:
        return
    regions = sum(row.awaiting_review for row in waiting.values())
    paths = [row.review_path for row in waiting.values()]
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    out.print(
        f"{regions} region(s) in {len(waiting)} document(s) await review: open them with "
        f"`ocrfleet review` (queue at /queue; {shown})",
        markup=False,
        overflow="fold",
    )


def _short(path: str) -> str:
    """The path as the user would write it from here, or the file name if far away."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("../..") else Path(path).name


def _print_skipped(skipped: list[tuple[Path, str]], out: Console | None = None) -> None:
    if not skipped:
        return
    out = out or console
    out.print(f"skipped {len(skipped)} file(s) in the folders given:", markup=False)
    for path, why in skipped:
        out.print(f"  {_short(display_uri(str(path)))}: {why}", markup=False, overflow="fold")


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
    """Print (or write) a document's result in one of the output formats (text: pages
    separated by a form feed). Exits 1, saying why on stderr, if the document is not done."""
    from ocrfleet.db.session import session_scope
    from ocrfleet.formats import FORMATS, render_document
    from ocrfleet.report import document_summaries, resolve_document
    from ocrfleet.states import SUCCEEDED
    from ocrfleet.storage import open_store

    if fmt not in FORMATS:
        raise _usage_error(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    settings = get_settings()
    _ensure_schema(settings.database_url)
    with session_scope(settings.database_url) as session:
        document_id = resolve_document(session, doc)
        if document_id is None:
            raise _usage_error(f"no document matches {display_uri(doc)!r}")
        summary = document_summaries(session, [document_id])[0]
        store = open_store(settings) if fmt == "pdf" else None
        data = render_document(session, document_id, fmt, store)
    if output is not None:
        output.write_bytes(data)
    elif data:
        sys.stdout.buffer.write(data if data.endswith(b"\n") or fmt == "pdf" else data + b"\n")
        sys.stdout.flush()
    if summary.status not in SUCCEEDED:
        console.print(
            f"document {document_id} is {summary.status}"
            + "".join(f"\n  {reason}" for reason in summary.reasons),
            markup=False,
        )
        raise typer.Exit(errors.EXIT_FAILED)


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
    settings = get_settings()
    try:
        rows = run_thresholds(dataset, settings)
    except ValueError as exc:  # a bad line of the dataset, named with its line number
        raise _usage_error(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps([row._asdict() for row in rows], indent=2) + "\n")
    else:
        Console().print(_threshold_table(f"thresholds for {dataset.name}", rows))
        from ocrfleet.thresholds import shipped_threshold_lines

        for line in shipped_threshold_lines(settings):
            console.print(line)
    if plot is not None:
        plot_rows(rows, plot)
        console.print(f"plot written to {plot}")


def _threshold_table(title: str, rows: list) -> Table:
    table = Table(title=title)
    for column in ("threshold", "accept rate", "precision", "95% lower bound", "accepted"):
        table.add_column(column, justify="right")
    for row in rows:
        precision = "" if row.precision is None else f"{row.precision:.3f}"
        lower = "" if row.lower_bound is None else f"{row.lower_bound:.3f}"
        table.add_row(
            f"{row.threshold:.2f}", f"{row.accept_rate:.3f}", precision, lower, str(row.n_accepted)
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


@app.command(name="run-id")
def run_id(
    as_json: Annotated[bool, typer.Option("--json", help="print id and parts as JSON")] = False,
    register: Annotated[
        bool, typer.Option("--register", help="record the run in OCRFLEET_DATABASE_URL")
    ] = False,
) -> None:
    """Print the run these settings and model files make, and its parts, to pin it with
    OCRFLEET_RUN_ID across images. --register records it, so that submitters pinned to it
    can submit before any of its workers has started. Exit 2 if OCRFLEET_RUN_ID names
    another run."""
    from ocrfleet.db.session import session_scope
    from ocrfleet.runs import check_pin, ensure_run, run_config, run_id_of

    settings = get_settings()
    config = run_config(settings)
    identity = run_id_of(config)
    if as_json:
        typer.echo(json.dumps({"run_id": identity, "pinned": settings.run_id, "config": config}))
    else:
        typer.echo(identity)
        for name, value in _leaves(config):
            typer.echo(f"  {name}: {json.dumps(value, ensure_ascii=False)}")
    check_pin(settings, identity)
    if register:
        _ensure_schema(settings.database_url)
        with session_scope(settings.database_url) as session:
            ensure_run(session, config)
        console.print(f"run {identity} registered", markup=False)


def _leaves(value: object, prefix: str = "") -> list[tuple[str, object]]:
    """`a.b.c` names and values of a JSON object's leaves, in key order."""
    if isinstance(value, dict) and value:
        return [leaf for key in sorted(value) for leaf in _leaves(value[key], f"{prefix}{key}.")]
    return [(prefix.rstrip("."), value)]


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


@app.command()
def gc(
    delete: Annotated[
        bool, typer.Option("--delete", help="delete them (default: only list them)")
    ] = False,
) -> None:
    """List the store's page images and intake objects that no database row references;
    `--delete` removes them. Run it while nothing is ingesting."""
    from ocrfleet.gc import collect_garbage

    settings = get_settings()
    _ensure_schema(settings.database_url)
    found = collect_garbage(settings, delete=delete)
    for key in found.keys:
        sys.stdout.write(key + "\n")
    verb = "deleted" if delete else "unreferenced (dry run; --delete removes them)"
    console.print(f"{len(found.keys)} object(s) {verb}; {found.kept} referenced", markup=False)


def main(argv: list[str] | None = None) -> None:
    """The console script: every failure is one line on stderr and an exit code. `run`
    reads pages in this process, so it first starts itself again with glibc's huge pages
    on (`memory.huge_pages_env`: a tunable read only at process start)."""
    if argv is None and sys.argv[1:2] == ["run"]:
        _restart_with_huge_pages()
    sys.exit(run_command(argv))


def _restart_with_huge_pages() -> None:
    from ocrfleet.memory import huge_pages_env

    env = huge_pages_env(os.environ)
    if env != dict(os.environ):
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def run_command(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    from pydantic import ValidationError
    from sqlalchemy import exc as sa_exc

    try:
        prepare_process()
        command = typer.main.get_command(app)
        result = command.main(args=argv, prog_name="ocrfleet", standalone_mode=False)
        return result if isinstance(result, int) else errors.EXIT_OK
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        console.print("aborted", markup=False)
        return 130
    except typer.TyperException as exc:  # click's usage errors
        message = exc.format_message()  # type: ignore[attr-defined]
        command = getattr(getattr(exc, "ctx", None), "command_path", "ocrfleet")
        return _one_line(f"{message} (see `{command} --help`)", errors.EXIT_USAGE)
    except ValidationError as exc:
        return _one_line(f"configuration: {errors.settings_error(exc)}", errors.EXIT_USAGE)
    except (errors.ConfigError, sa_exc.ArgumentError, sa_exc.NoSuchModuleError) as exc:
        return _one_line(f"configuration: {exc}", errors.EXIT_USAGE)
    except sa_exc.OperationalError as exc:
        return _one_line(f"database: {errors.describe(exc.orig or exc)}", errors.EXIT_USAGE)
    except Exception as exc:
        where = _log_traceback(exc)
        return _one_line(f"internal error: {errors.describe(exc)}{where}", errors.EXIT_INTERNAL)


def _one_line(message: str, code: int) -> int:
    console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return code


def prepare_process() -> None:
    """Offline flags and caches into OCRFLEET_CACHE_DIR, and the log file there, before any
    engine library loads. Invalid settings are reported by the command that reads them; a
    cache folder that cannot be written is a configuration error."""
    from pydantic import ValidationError

    from ocrfleet import offline

    try:
        settings = get_settings()
    except ValidationError:
        return
    try:
        root = offline.prepare(settings.cache_dir)
        _log_to(root / LOG_NAME)
    except OSError as exc:
        raise errors.ConfigError(
            f"OCRFLEET_CACHE_DIR={settings.cache_dir} is not a folder ocrfleet can write: "
            f"{exc.strerror or exc}"
        ) from None


def _log_to(path: Path) -> None:
    """ocrfleet's own log records (and tracebacks) go to a file, not the console."""
    if any(getattr(h, "baseFilename", None) == str(path) for h in log.handlers):
        return
    handler = logging.FileHandler(path, encoding="utf-8", errors="backslashreplace")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def _log_traceback(exc: BaseException) -> str:
    """Write the traceback to the log file; returns ' (traceback in PATH)' or ''."""
    paths = [h.baseFilename for h in log.handlers if hasattr(h, "baseFilename")]
    if not paths:
        return ""
    log.error("internal error", exc_info=exc)
    return f" (traceback in {paths[0]})"


if __name__ == "__main__":
    main()
