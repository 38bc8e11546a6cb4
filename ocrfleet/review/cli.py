"""Back-office commands: `ocrfleet review` (the web app), `ocrfleet users add`, and
`ocrfleet export ocr-sft|jev` (reviewed regions as training rows).

`register(app)` adds them to the main typer app (ocrfleet/cli.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(stderr=True)
users_app = typer.Typer(no_args_is_help=True, help="Back-office accounts.")
export_app = typer.Typer(no_args_is_help=True, help="Reviewed regions as training data.")


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(2)


def review(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
) -> None:
    """Serve the review web app over OCRFLEET_DATABASE_URL and OCRFLEET_STORE_URL."""
    import uvicorn

    from ocrfleet.cli import _ensure_schema
    from ocrfleet.config import get_settings
    from ocrfleet.review.app import ConfigurationError, create_app

    settings = get_settings()
    try:
        app = create_app(settings)
    except ConfigurationError as error:
        raise _fail(str(error)) from None
    _ensure_schema(settings.database_url)
    uvicorn.run(app, host=host, port=port, log_level="warning")


@users_app.command("add")
def users_add(
    name: Annotated[str, typer.Argument(help="login name")],
    role: Annotated[str, typer.Option(help="reviewer or admin")] = "reviewer",
    tenant: Annotated[
        str | None, typer.Option(help="see only documents whose metadata tenant is this")
    ] = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="read the password from standard input")
    ] = False,
) -> None:
    """Create an account (the password is asked for, or read from stdin)."""
    from ocrfleet.cli import _ensure_schema
    from ocrfleet.config import get_settings
    from ocrfleet.db.session import session_scope
    from ocrfleet.review.users import add_user

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    settings = get_settings()
    _ensure_schema(settings.database_url)
    try:
        with session_scope(settings.database_url) as session:
            account = add_user(session, name, password, role, tenant)
    except ValueError as error:
        raise _fail(str(error)) from None
    scope = f"tenant {account.tenant}" if account.tenant else "every tenant"
    console.print(f"user {account.name} ({account.role}, {scope}) added")


def register(app: typer.Typer) -> None:
    """Add `review`, `users` and `export` to the main CLI."""
    app.command("review")(review)
    app.add_typer(users_app, name="users")
    app.add_typer(export_app, name="export")


_ = Path  # used by the export commands' annotations
