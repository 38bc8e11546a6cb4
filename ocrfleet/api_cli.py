"""HTTP API commands: `ocrfleet api`, `ocrfleet keys add|revoke|webhook-secret|
rotate-webhook-secret`, `ocrfleet cancel`.

`register(app)` adds them to the main typer app (ocrfleet/cli.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

keys_app = typer.Typer(no_args_is_help=True, help="API keys of tenants.")


def api(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Serve the HTTP API (OpenAPI docs at /docs) until SIGTERM/SIGINT. With --workers N
    above 1, /metrics sums the N processes (metric files under OCRFLEET_CACHE_DIR)."""
    import os

    import uvicorn

    from ocrfleet.api.metrics import MULTIPROC_ENV, multiprocess_dir
    from ocrfleet.config import get_settings

    settings = get_settings()
    if not settings.broker_url:
        typer.echo("error: OCRFLEET_BROKER_URL is not set: the API submits to a fleet", err=True)
        raise typer.Exit(2)
    if workers > 1 and not os.environ.get(MULTIPROC_ENV):  # inherited by the workers
        os.environ[MULTIPROC_ENV] = str(multiprocess_dir(settings.cache_dir, port))
    uvicorn.run(
        "ocrfleet.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        proxy_headers=True,
        # Longer than uvicorn's 5 s: a client reusing a connection the server is closing
        # gets a reset, which under load happens often enough to count.
        timeout_keep_alive=75,
    )


@keys_app.command("add")
def keys_add(tenant: Annotated[str, typer.Argument(help="the tenant the key acts for")]) -> None:
    """Make a key for TENANT and print it: it is shown this once, only its hash is kept."""
    from ocrfleet.api.keys import add_key
    from ocrfleet.config import get_settings
    from ocrfleet.db.session import session_scope

    try:
        with session_scope(get_settings().database_url) as session:
            key_id, key = add_key(session, tenant)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(key)
    typer.echo(
        f"key {key_id} for tenant {tenant!r}; store it now, it is not shown again. Its "
        f"callbacks are signed with kid={key_id}: `ocrfleet keys webhook-secret {key_id}` "
        "prints the secret for the tenant's receiver",
        err=True,
    )


@keys_app.command("webhook-secret")
def keys_webhook_secret(
    key_id: Annotated[int, typer.Argument(help="the id `keys add` printed")],
) -> None:
    """Print the secret that signs the callbacks of KEY_ID's documents (kid=KEY_ID)."""
    from ocrfleet.api.keys import webhook_secret

    _echo_secret(webhook_secret, key_id)


@keys_app.command("rotate-webhook-secret")
def keys_rotate_webhook_secret(
    key_id: Annotated[int, typer.Argument(help="the id `keys add` printed")],
) -> None:
    """Replace KEY_ID's webhook secret and print the new one. It applies at once, retries of
    earlier callbacks included: give the receiver the new secret first, or accept both."""
    from ocrfleet.api.keys import rotate_webhook_secret

    _echo_secret(rotate_webhook_secret, key_id)


def _echo_secret(secret_of: Callable[[Session, int], str | None], key_id: int) -> None:
    """Print what `secret_of` gives for KEY_ID in one session; exit 1 when there is no key."""
    from ocrfleet.config import get_settings
    from ocrfleet.db.session import session_scope

    with session_scope(get_settings().database_url) as session:
        secret = secret_of(session, key_id)
    if secret is None:
        typer.echo(f"error: no key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(secret)


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[int, typer.Argument(help="the id `keys add` printed")]) -> None:
    """Revoke a key (running APIs stop accepting it within 30 s)."""
    from ocrfleet.api.keys import revoke_key
    from ocrfleet.config import get_settings
    from ocrfleet.db.session import session_scope

    with session_scope(get_settings().database_url) as session:
        if not revoke_key(session, key_id):
            typer.echo(f"error: no active key {key_id}", err=True)
            raise typer.Exit(1)


def cancel(doc: Annotated[int, typer.Argument(help="document id")]) -> None:
    """Cancel a document: queued pages are skipped, running ones finish."""
    from ocrfleet import client, ir

    try:
        state = client.cancel(doc)
    except LookupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"{state.id}\t{state.status.value}")
    if state.status != ir.DocumentStatus.cancelled:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `api`, `keys` and `cancel` to the main CLI."""
    app.command("api")(api)
    app.command("cancel")(cancel)
    app.add_typer(keys_app, name="keys")
