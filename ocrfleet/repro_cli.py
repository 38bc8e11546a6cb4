"""`ocrfleet repro`: run one input N times under one run and compare, or compare two stored
runs. Exit 0 when every output is identical, 1 when any differs (the differences are
classified and listed), 2 on a usage error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ocrfleet.config import Settings, get_settings
from ocrfleet.repro import (
    Difference,
    PageOutput,
    compare_documents,
    config_changes,
    counts,
    document_sha256,
    stored_outputs,
    unexplained,
)

console = Console(stderr=True)


def run_times(path: Path, settings: Settings, times: int) -> tuple[str, list[list[PageOutput]]]:
    """The run_id and `times` outputs of `path`, each page through the whole page path
    (orientation included) with one set of loaded models (as a worker runs them), nothing
    written."""
    from ocrfleet.pipeline.page import process_png
    from ocrfleet.pipeline.sandbox import split_document
    from ocrfleet.runs import run_config, run_id_of
    from ocrfleet.service import output_sha256
    from ocrfleet.toolkit import get_toolkit

    run_id = run_id_of(run_config(settings))
    toolkit = get_toolkit(settings)
    data = path.read_bytes()
    outputs: list[list[PageOutput]] = []
    for _ in range(times):
        pages = []
        # Split under the budget, and read back from PNG as a worker reads a stored page.
        with split_document(data, settings, str(path)) as split:
            for page in split.pages():
                processed = process_png(page.number, page.png, toolkit)
                result = processed.result
                size = processed.image.size  # upright, as a worker records it
                pages.append(PageOutput(page.number, size, result, output_sha256(result)))
        outputs.append(pages)
    return run_id, outputs


def _report(differences: list[Difference], as_json: bool, header: dict[str, Any]) -> None:
    found = counts(differences)
    if as_json:
        body = {**header, "identical": not differences, "counts": found}
        body["differences"] = [d.__dict__ for d in differences]
        typer.echo(json.dumps(body, ensure_ascii=False, indent=2))
        return
    for key, value in header.items():
        if isinstance(value, list):
            for item in value:
                typer.echo(f"{key}: {item}")
        else:
            typer.echo(f"{key}: {value}")
    if not differences:
        typer.echo("identical")
        return
    typer.echo("differences: " + ", ".join(f"{kind} {n}" for kind, n in found.items()))
    for d in differences:
        typer.echo(
            f"  page {d.page} region {d.region_a}->{d.region_b} {d.kind}: "
            f"{d.text_a!r} -> {d.text_b!r}"
        )


def repro(
    file: Annotated[Path | None, typer.Argument(help="an input file to run --times times")] = None,
    times: Annotated[int, typer.Option("--times", min=2, help="how many runs")] = 3,
    against: Annotated[
        tuple[str, str] | None,
        typer.Option("--against", help="compare two stored runs: RUN_A RUN_B"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Check that output is reproducible: the same input N times under one run, or two
    stored runs; classify any differences and exit 1 if there are some."""
    settings = get_settings()
    if (file is None) == (against is None):
        console.print("[red]error:[/red] give either FILE or --against RUN_A RUN_B")
        raise typer.Exit(2)
    if file is not None:
        if not file.is_file():
            console.print(f"[red]error:[/red] no such file: {file}")
            raise typer.Exit(2)
        run_id, outputs = run_times(file, settings, times)
        hashes = [document_sha256([p.sha256 for p in pages]) for pages in outputs]
        differences = []
        for other in outputs[1:]:
            found = compare_documents(outputs[0], other)
            differences += found or unexplained(outputs[0], other)
        _report(differences, as_json, {"run_id": run_id, "output_sha256": hashes})
        raise typer.Exit(1 if differences else 0)

    from ocrfleet.db.models import Run
    from ocrfleet.db.session import session_scope

    assert against is not None
    run_a, run_b = against
    with session_scope(settings.database_url) as session:
        configs = {run: session.get(Run, run) for run in (run_a, run_b)}
        missing = [run for run, row in configs.items() if row is None]
        if missing:
            console.print(f"[red]error:[/red] no such run: {', '.join(missing)}")
            raise typer.Exit(2)
        changed = config_changes(configs[run_a].config, configs[run_b].config)  # type: ignore[union-attr]
        outputs_a, outputs_b = stored_outputs(session, run_a), stored_outputs(session, run_b)
    shared = sorted(set(outputs_a) & set(outputs_b))
    if not shared:
        console.print("[red]error:[/red] the two runs have no input in common")
        raise typer.Exit(2)
    differences: list[Difference] = []
    hashes = []
    for sha256 in shared:
        a, b = outputs_a[sha256], outputs_b[sha256]
        hashes.append(
            f"{sha256[:12]} {document_sha256([p.sha256 for p in a])} "
            f"{document_sha256([p.sha256 for p in b])}"
        )
        differences += compare_documents(a, b) or unexplained(a, b)
    header = {"runs": f"{run_a} {run_b}", "config changed": changed, "output_sha256": hashes}
    _report(differences, as_json, header)
    raise typer.Exit(1 if differences else 0)


def register(app: typer.Typer) -> None:
    app.command(name="repro")(repro)
