"""`ocrfleet review`: the back-office web app (Starlette, server-rendered Jinja2, a few
lines of plain JavaScript for keyboard shortcuts).

Every route needs a login: pages redirect to /login, anything else answers 401. Every
form carries the session's CSRF token; a post without it is refused with 403. Every query
is scoped to the account's tenant, so another tenant's region is a 404. Nothing changes on
a GET: claims and decisions are POSTs. Odd input is a 4xx with a one-line reason, and
every response carries the security headers (`headers.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio
from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ocrfleet import ir
from ocrfleet.config import Settings
from ocrfleet.db.models import Page, utcnow
from ocrfleet.db.session import session_scope
from ocrfleet.formats import text as text_format
from ocrfleet.formats.document import load_document
from ocrfleet.review import images
from ocrfleet.review.auth import CSRF_FIELD, LoginThrottle, csrf_ok, csrf_token
from ocrfleet.review.headers import SecurityHeaders, csp_nonce
from ocrfleet.review.queue import (
    STATES,
    BadFilter,
    Filters,
    document_detail,
    next_region,
    open_flags,
    parse_id,
    reason_counts,
    region_detail,
)
from ocrfleet.review.record import (
    REFUSALS,
    AdminOnly,
    ClaimedByOther,
    Conflict,
    Decision,
    ReviewRefused,
    record_review,
)
from ocrfleet.review.users import (
    MAX_NAME,
    MAX_PASSWORD,
    Account,
    authenticate,
    get_account,
    revoke_sessions,
)
from ocrfleet.scorers.render import RenderError
from ocrfleet.storage.base import ObjectNotFound

_templates = Environment(
    loader=PackageLoader("ocrfleet.review", "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)

Handler = Callable[..., Response]
MIN_SECRET = 32  # characters of OCRFLEET_REVIEW_SECRET
MAX_FORM_BYTES = 1 << 20  # a correction is at most 100,000 characters
MAX_FORM_FIELDS = 20
HASH_WAIT_S = 10.0  # a login waits this long for a free hash slot, then gets 503


class ConfigurationError(ValueError):
    pass


class BadRequest(ValueError):
    """A request the app cannot take; the message is the one-line reason of a 4xx."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _page(request: Request, name: str, account: Account | None, **context: Any) -> HTMLResponse:
    html = _templates.get_template(name).render(
        account=account,
        csrf=csrf_token(request),
        csrf_field=CSRF_FIELD,
        nonce=csp_nonce(request),
        **context,
    )
    return HTMLResponse(html)


def _reason(message: str, status: int) -> PlainTextResponse:
    return PlainTextResponse(message, status_code=status)


def _session_account(request: Request, session: Session) -> Account | None:
    user_id = request.session.get("user_id")
    generation = request.session.get("generation")
    if not isinstance(user_id, int) or not isinstance(generation, int):
        return None
    if parse_id(user_id) is None:
        return None
    return get_account(session, user_id, generation)


def _guarded(handler: Callable[..., Response], request: Request, *args: Any) -> Response:
    """Run a handler; its client errors become their 4xx."""
    try:
        return handler(request, *args)
    except BadFilter as error:
        return _reason(str(error), 400)
    except BadRequest as error:
        return _reason(str(error), error.status)


def page(handler: Handler) -> Handler:
    """A GET route for logged-in accounts; anyone else is sent to the login form."""

    @functools.wraps(handler)
    def wrapper(request: Request) -> Response:
        with session_scope(_settings(request)) as session:
            account = _session_account(request, session)
            if account is None:
                wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                target = "/login?" + urlencode({"next": wanted})
                return RedirectResponse(target, status_code=303)
            return _guarded(handler, request, session, account)

    return wrapper


def resource(handler: Handler) -> Handler:
    """A GET route for images: 401 without a login (no redirect to a page); a page image
    gone from the store is a 404 that says so, not a server error."""

    @functools.wraps(handler)
    def wrapper(request: Request) -> Response:
        with session_scope(_settings(request)) as session:
            account = _session_account(request, session)
            if account is None:
                return _reason("login required", 401)
            try:
                return _guarded(handler, request, session, account)
            except ObjectNotFound:
                return _reason("page image missing from the store", 404)

    return wrapper


async def _form(request: Request) -> dict[str, str]:
    """The posted form (application/x-www-form-urlencoded, what every form here sends),
    read up to MAX_FORM_BYTES."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("", "application/x-www-form-urlencoded"):
        raise BadRequest("forms are application/x-www-form-urlencoded", 415)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadRequest(f"form over {MAX_FORM_BYTES} bytes", 413)
    try:
        pairs = parse_qsl(
            body.decode("utf-8", "replace"),
            keep_blank_values=True,
            max_num_fields=MAX_FORM_FIELDS,
        )
    except ValueError:
        raise BadRequest(f"a form has at most {MAX_FORM_FIELDS} fields") from None
    return dict(pairs)


def action(handler: Handler) -> Callable[[Request], Any]:
    """A POST route: 401 without a login, 403 without the session's CSRF token."""

    def run(request: Request, form: dict[str, str]) -> Response:
        with session_scope(_settings(request)) as session:
            account = _session_account(request, session)
            if account is None:
                return _reason("login required", 401)
            if not csrf_ok(request, form.get(CSRF_FIELD)):
                return _reason("missing or wrong CSRF token", 403)
            return _guarded(handler, request, session, account, form)

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        try:
            form = await _form(request)
        except BadRequest as error:
            return _reason(str(error), error.status)
        return await run_in_threadpool(run, request, form)

    return wrapper


def _not_found() -> PlainTextResponse:
    return _reason("not found", 404)


def _id(request: Request, name: str) -> int:
    """A path id; one outside BIGINT's range is no row (404), not a database error."""
    value = parse_id(request.path_params.get(name))
    if value is None:
        raise BadRequest("not found", 404)
    return value


def _safe_next(target: str | None) -> str:
    """Only a local path: never send someone off-site after login."""
    if (
        target
        and target.startswith("/")
        and not target.startswith(("//", "/\\"))
        and target.isprintable()
        and len(target) <= 2000
    ):
        return target
    return "/queue"


# -- login ---------------------------------------------------------------------------


def login_form(request: Request) -> Response:
    return _page(request, "login.html", None, next=_safe_next(request.query_params.get("next")))


async def login(request: Request) -> Response:
    try:
        form = await _form(request)
    except BadRequest as error:
        return _reason(str(error), error.status)
    if not csrf_ok(request, form.get(CSRF_FIELD)):
        return _reason("missing or wrong CSRF token", 403)
    name = form.get("name", "")
    password = form.get("password", "")
    if not name or len(name) > MAX_NAME or not name.isprintable():
        return _reason(f"name: 1 to {MAX_NAME} printable characters", 400)
    if len(password) > MAX_PASSWORD:
        return _reason(f"password: at most {MAX_PASSWORD} characters", 400)
    address = request.client.host if request.client else "unknown"
    settings = _settings(request)
    throttle: LoginThrottle = request.app.state.throttle

    def count() -> bool:
        with session_scope(settings) as session:
            return throttle.attempt(session, name, address)

    if not await run_in_threadpool(count):
        return _reason("too many failed logins; try again later", 429)

    def check() -> Account | None:
        with session_scope(settings) as session:
            account = authenticate(session, name, password)
            if account is not None:
                throttle.succeeded(session, name, address)
            return account

    slots: anyio.Semaphore = request.app.state.hash_slots
    with anyio.move_on_after(HASH_WAIT_S) as waited:
        await slots.acquire()
    if waited.cancelled_caught:
        return _reason("too many logins at once; try again shortly", 503)
    try:
        account = await run_in_threadpool(check)
    finally:
        slots.release()
    if account is None:
        target = _safe_next(form.get("next"))
        response = _page(request, "login.html", None, next=target, failed=True)
        response.status_code = 401
        return response
    request.session.clear()  # a fresh session (and CSRF token) after login
    request.session["user_id"] = account.id
    request.session["generation"] = account.generation
    return RedirectResponse(_safe_next(form.get("next")), status_code=303)


@action
def logout(request: Request, session: Session, account: Account, form: dict[str, Any]) -> Response:
    revoke_sessions(session, account.id)  # every copy of every cookie of this account
    request.session.clear()
    return RedirectResponse("/login", status_code=303)


# -- queue ---------------------------------------------------------------------------


@page
def home(request: Request, session: Session, account: Account) -> Response:
    return RedirectResponse("/queue", status_code=303)


@page
def queue(request: Request, session: Session, account: Account) -> Response:
    filters = Filters.from_query(request.query_params)
    return _page(
        request,
        "queue.html",
        account,
        filters=filters,
        query=urlencode(filters.as_query()),
        counts=reason_counts(session, account, filters),
        rows=open_flags(session, account, filters),
        finished=request.query_params.get("finished") == "1",
    )


def _next_response(request: Request, session: Session, account: Account) -> Response:
    """Claim the next region under the request's filters and go there."""
    filters = Filters.from_query(request.query_params)
    query = urlencode(filters.as_query())
    region_id = next_region(session, account, filters, _settings(request).review_claim_seconds)
    if region_id is None:
        return RedirectResponse(f"/queue?{query}&finished=1", status_code=303)
    return RedirectResponse(f"/regions/{region_id}?{query}", status_code=303)


@action
def next_flag(
    request: Request, session: Session, account: Account, form: dict[str, Any]
) -> Response:
    return _next_response(request, session, account)


# -- region --------------------------------------------------------------------------


def _region_page(
    request: Request,
    session: Session,
    account: Account,
    region_id: int,
    *,
    error: str | None = None,
    conflict: Decision | None = None,
) -> Response:
    detail = region_detail(session, account, region_id)
    if detail is None:
        return _not_found()
    filters = Filters.from_query(request.query_params)
    return _page(
        request,
        "region.html",
        account,
        region=detail,
        held=not detail.held_by_other(account, utcnow()),
        query=urlencode(filters.as_query()),
        error=error,
        conflict=conflict,
    )


@page
def region_view(request: Request, session: Session, account: Account) -> Response:
    """The region; looking claims nothing (POST /next does)."""
    error = REFUSALS.get(request.query_params.get("error", ""))
    return _region_page(request, session, account, _id(request, "region_id"), error=error)


@resource
def region_page_image(request: Request, session: Session, account: Account) -> Response:
    detail = region_detail(session, account, _id(request, "region_id"))
    if detail is None:
        return _not_found()
    page_image = request.app.state.pages.get(detail.image_uri)
    data = images.page_with_boxes(page_image, [(detail.bbox, "current")])
    return Response(data, media_type="image/jpeg")


@resource
def region_crop(request: Request, session: Session, account: Account) -> Response:
    detail = region_detail(session, account, _id(request, "region_id"))
    if detail is None:
        return _not_found()
    page_image = request.app.state.pages.get(detail.image_uri)
    return Response(images.enlarged_crop(page_image, detail.bbox), media_type="image/png")


@resource
def region_rendered(request: Request, session: Session, account: Account) -> Response:
    detail = region_detail(session, account, _id(request, "region_id"))
    engine = request.path_params.get("engine")
    if detail is None:
        return _not_found()
    candidate = next((c for c in detail.candidates if c.engine == engine), None)
    if candidate is None or candidate.error is not None:
        return _not_found()
    page_image = request.app.state.pages.get(detail.image_uri)
    try:
        data = images.enlarged_rendering(
            page_image,
            detail.bbox,
            candidate.text,
            detail.category,
            _settings(request).render_font_path,
        )
    except RenderError:
        return _reason("this candidate cannot be rendered", 422)
    return Response(data, media_type="image/png")


@action
def review(request: Request, session: Session, account: Account, form: dict[str, Any]) -> Response:
    region_id = _id(request, "region_id")
    filters = Filters.from_query(request.query_params)
    query = urlencode(filters.as_query())
    name, _, engine = str(form.get("action", "")).partition(":")
    try:
        decision = ir.ReviewAction(name)
    except ValueError:
        return _reason("action: accept:ENGINE, correct, unreadable or skip", 400)
    version = form.get("version", "")
    if version != "0" and parse_id(version) is None:
        return _reason("version: the id of the decision the page showed (0 for none)", 400)
    try:
        record_review(
            session,
            account,
            region_id,
            decision,
            engine=engine or None,
            text=str(form.get("text", "")),
            version=int(version),
        )
    except LookupError:
        return _not_found()
    except ClaimedByOther:
        return _reason("another reviewer holds this region now", 409)
    except AdminOnly as error:
        return _reason(str(error), 403)
    except Conflict as error:
        response = _region_page(request, session, account, region_id, conflict=error.current)
        response.status_code = 409
        return response
    except ReviewRefused as error:
        message = urlencode({"error": error.code})
        return RedirectResponse(f"/regions/{region_id}?{query}&{message}", status_code=303)
    return _next_response(request, session, account)


# -- document ------------------------------------------------------------------------


@page
def document_view(request: Request, session: Session, account: Account) -> Response:
    detail = document_detail(session, account, _id(request, "document_id"))
    if detail is None:
        return _not_found()
    return _page(
        request,
        "document.html",
        account,
        document=detail,
        text=text_format.render(load_document(session, detail.id)),
        states=STATES,
        colours={k: "#{:02x}{:02x}{:02x}".format(*v) for k, v in images.COLOURS.items()},
    )


@resource
def document_page_image(request: Request, session: Session, account: Account) -> Response:
    detail = document_detail(session, account, _id(request, "document_id"))
    number = request.path_params.get("number")
    if detail is None:
        return _not_found()
    page_id = next((pid for pid, n in detail.pages if n == number), None)
    if page_id is None:
        return _not_found()
    uri = session.scalar(select(Page.image_uri).where(Page.id == page_id))
    boxes = [(r.bbox, r.state) for r in detail.regions if r.page_number == number]
    data = images.page_with_boxes(request.app.state.pages.get(uri), boxes)
    return Response(data, media_type="image/jpeg")


def create_app(settings: Settings) -> Starlette:
    """The app over `settings`' database and store; needs `review_secret`."""
    if not settings.review_secret or len(settings.review_secret) < MIN_SECRET:
        raise ConfigurationError(
            f"OCRFLEET_REVIEW_SECRET is not set or shorter than {MIN_SECRET} characters: "
            f"{MIN_SECRET}+ random characters that sign session cookies"
        )
    app = Starlette(
        routes=[
            Route("/login", login_form, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/", home, methods=["GET"]),
            Route("/queue", queue, methods=["GET"]),
            Route("/next", next_flag, methods=["POST"]),
            Route("/regions/{region_id:int}", region_view, methods=["GET"]),
            Route("/regions/{region_id:int}/page.jpg", region_page_image, methods=["GET"]),
            Route("/regions/{region_id:int}/crop.png", region_crop, methods=["GET"]),
            Route(
                "/regions/{region_id:int}/rendered/{engine}.png", region_rendered, methods=["GET"]
            ),
            Route("/regions/{region_id:int}/review", review, methods=["POST"]),
            Route("/documents/{document_id:int}", document_view, methods=["GET"]),
            Route(
                "/documents/{document_id:int}/pages/{number:int}.jpg",
                document_page_image,
                methods=["GET"],
            ),
        ],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                SessionMiddleware,
                secret_key=settings.review_secret,
                session_cookie="ocrfleet_review",
                max_age=settings.review_session_hours * 3600,
                same_site="lax",
                https_only=settings.review_https_only,
            ),
        ],
    )
    app.state.settings = settings
    app.state.pages = images.PageImages(settings)
    app.state.throttle = LoginThrottle(
        pair_attempts=settings.review_login_attempts,
        name_attempts=settings.review_login_name_attempts,
        address_attempts=settings.review_login_address_attempts,
        window=settings.review_login_window_seconds,
    )
    app.state.hash_slots = anyio.Semaphore(settings.review_max_hashes)
    return app
