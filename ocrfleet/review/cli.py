"""Back-office commands: `ocrfleet review` (the web app), `ocrfleet users
add|list|passwd|disable|enable|remove`, and `ocrfleet export ocr-sft|jev` (reviewed regions
as training rows). Passwords are read from a prompt or stdin, never from argv.

`register(app)` adds them to the main typer app (ocrfleet/cli.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

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


PASSWORD_STDIN = typer.Option("--password-stdin", help="read the password from standard input")


def _password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    return typer.prompt("password", hide_input=True, confirmation_prompt=True)


def _change(name: str, change: Callable[[Session, str], str]) -> None:
    """Apply one change to the account `name` in its own transaction; say what it did."""
    from ocrfleet.cli import _ensure_schema
    from ocrfleet.config import get_settings
    from ocrfleet.db.session import session_scope

    settings = get_settings()
    _ensure_schema(settings.database_url)
    try:
        with session_scope(settings.database_url) as session:
            done = change(session, name)
    except (LookupError, ValueError) as error:
        raise _fail(str(error).strip("'\"")) from None
    console.print(f"user {name} {done}", markup=False)


def _saying(done: str, change: Callable[[Session, str], None]) -> Callable[[Session, str], str]:
    def run(session: Session, name: str) -> str:
        change(session, name)
        return done

    return run


@users_app.command("add")
def users_add(
    name: Annotated[str, typer.Argument(help="login name")],
    role: Annotated[str, typer.Option(help="reviewer or admin")] = "reviewer",
    tenant: Annotated[str | None, typer.Option(help="see only this tenant's documents")] = None,
    all_tenants: Annotated[
        bool, typer.Option("--global", help="see every tenant's documents")
    ] = False,
    password_stdin: Annotated[bool, PASSWORD_STDIN] = False,
) -> None:
    """Create an account (the password is asked for, or read from stdin). Without --tenant
    or --global it sees only documents that have no tenant."""
    from ocrfleet.review.users import GLOBAL, add_user

    if all_tenants and tenant is not None:
        raise _fail("--tenant and --global exclude each other")
    if tenant == GLOBAL:
        raise _fail(f"tenant {GLOBAL!r} means every tenant: say --global")
    password = _password(password_stdin)

    def add(session: Session, name: str) -> str:
        account = add_user(session, name, password, role, GLOBAL if all_tenants else tenant)
        return f"({account.role}, {account.scope}) added"

    _change(name, add)


@users_app.command("list")
def users_list() -> None:
    """Every account: name, role, what it sees, and whether it is disabled."""
    from ocrfleet.cli import _ensure_schema
    from ocrfleet.config import get_settings
    from ocrfleet.db.session import session_scope
    from ocrfleet.review.users import list_users

    settings = get_settings()
    _ensure_schema(settings.database_url)
    with session_scope(settings.database_url) as session:
        for user in list_users(session):
            state = "disabled" if user.disabled else "active"
            print(f"{user.name}\t{user.role}\t{user.scope}\t{state}")


@users_app.command("passwd")
def users_passwd(
    name: Annotated[str, typer.Argument(help="login name")],
    password_stdin: Annotated[bool, PASSWORD_STDIN] = False,
) -> None:
    """Set a new password; every session of the account ends."""
    from ocrfleet.review.users import set_password

    password = _password(password_stdin)

    def change(session: Session, name: str) -> str:
        set_password(session, name, password)
        return "has a new password; its sessions ended"

    _change(name, change)


@users_app.command("disable")
def users_disable(name: Annotated[str, typer.Argument(help="login name")]) -> None:
    """No more logins; every session of the account ends at once."""
    from ocrfleet.review.users import disable_user

    _change(name, _saying("disabled; its sessions ended", disable_user))


@users_app.command("enable")
def users_enable(name: Annotated[str, typer.Argument(help="login name")]) -> None:
    """Allow logins again."""
    from ocrfleet.review.users import enable_user

    _change(name, _saying("enabled", enable_user))


@users_app.command("remove")
def users_remove(name: Annotated[str, typer.Argument(help="login name")]) -> None:
    """Delete an account that made no review (one that did is kept: disable it)."""
    from ocrfleet.review.users import remove_user

    _change(name, _saying("removed", remove_user))


def register(app: typer.Typer) -> None:
    """Add `review`, `users` and `export` to the main CLI."""
    app.command("review")(review)
    app.add_typer(users_app, name="users")
    app.add_typer(export_app, name="export")


def _export(kind: str, out: Path, eval_fraction: float, tenant: str | None, **options: str) -> None:
    from ocrfleet.cli import _ensure_schema
    from ocrfleet.config import get_settings
    from ocrfleet.db.session import session_scope
    from ocrfleet.review.exports import eval_path, export_jev, export_ocr_sft
    from ocrfleet.review.reviewed import reviewed_regions

    if not 0.0 <= eval_fraction < 1.0:
        raise _fail("--eval-fraction must be in [0, 1)")
    settings = get_settings()
    _ensure_schema(settings.database_url)
    with session_scope(settings.database_url) as session:
        regions = reviewed_regions(session, tenant=tenant)
    if kind == "jev":
        summary = export_jev(regions, out, settings, eval_fraction=eval_fraction)
    else:
        summary = export_ocr_sft(regions, out, settings, eval_fraction=eval_fraction, **options)
    console.print(
        f"{summary.train} train rows ({summary.pages_train} pages) in {out}, "
        f"{summary.eval} eval rows ({summary.pages_eval} pages) in {eval_path(out)}; "
        f"{summary.skipped} skipped"
    )


EVAL_HELP = "share of pages (by hash) that go to OUT.eval.jsonl"


@export_app.command("ocr-sft")
def export_ocr_sft_command(
    out: Annotated[Path, typer.Argument(help="train rows here; eval rows in OUT.eval.jsonl")],
    eval_fraction: Annotated[float, typer.Option(help=EVAL_HELP)] = 0.1,
    variant: Annotated[str, typer.Option(help="llamafactory or ms-swift")] = "llamafactory",
    tenant: Annotated[str | None, typer.Option(help="only this tenant's documents")] = None,
) -> None:
    """Reviewed regions as MiniCPM-OCR fine-tuning rows (crop + final text)."""
    if variant not in ("llamafactory", "ms-swift"):
        raise _fail("--variant must be llamafactory or ms-swift")
    _export("ocr-sft", out, eval_fraction, tenant, variant=variant)


@export_app.command("jev")
def export_jev_command(
    out: Annotated[Path, typer.Argument(help="train rows here; eval rows in OUT.eval.jsonl")],
    eval_fraction: Annotated[float, typer.Option(help=EVAL_HELP)] = 0.1,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's documents")] = None,
) -> None:
    """Reviewed candidates as Jev rows ([crop, rendered], prompt, label)."""
    _export("jev", out, eval_fraction, tenant)
