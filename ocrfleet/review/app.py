"""`ocrfleet review`: the back-office web app (Starlette, server-rendered Jinja2, a few
lines of plain JavaScript for keyboard shortcuts).

Every route needs a login: pages redirect to /login, anything else answers 401. Every
form carries the session's CSRF token; a post without it is refused with 403. Every query
is scoped to the account's tenant, so another tenant's region is a 404.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

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
from ocrfleet.db.models import Page
from ocrfleet.db.session import session_scope
from ocrfleet.formats import text as text_format
from ocrfleet.formats.document import load_document
from ocrfleet.review import images
from ocrfleet.review.auth import CSRF_FIELD, LoginThrottle, csrf_ok, csrf_token
from ocrfleet.review.queue import (
    STATES,
    Filters,
    claim,
    document_detail,
    next_region,
    open_flags,
    reason_counts,
    region_detail,
)
from ocrfleet.review.record import ClaimedByOther, ReviewRefused, record_review
from ocrfleet.review.users import Account, authenticate, get_account
from ocrfleet.scorers.render import RenderError
from ocrfleet.storage.base import ObjectNotFound

_templates = Environment(
    loader=PackageLoader("ocrfleet.review", "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)

Handler = Callable[..., Response]


class ConfigurationError(ValueError):
    pass


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _page(request: Request, name: str, account: Account | None, **context: Any) -> HTMLResponse:
    html = _templates.get_template(name).render(
        account=account, csrf=csrf_token(request), csrf_field=CSRF_FIELD, **context
    )
    return HTMLResponse(html)


def _session_account(request: Request, session: Session) -> Account | None:
    user_id = request.session.get("user_id")
    if not isinstance(user_id, int):
        return None
    return get_account(session, user_id)


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
            return handler(request, session, account)

    return wrapper


def resource(handler: Handler) -> Handler:
    """A GET route for images: 401 without a login (no redirect to a page); a page image
    gone from the store is a 404 that says so, not a server error."""

    @functools.wraps(handler)
    def wrapper(request: Request) -> Response:
        with session_scope(_settings(request)) as session:
            account = _session_account(request, session)
            if account is None:
                return PlainTextResponse("login required", status_code=401)
            try:
                return handler(request, session, account)
            except ObjectNotFound as error:
                return PlainTextResponse(f"page image missing: {error}", status_code=404)

    return wrapper


def action(handler: Handler) -> Callable[[Request], Any]:
    """A POST route: 401 without a login, 403 without the session's CSRF token."""

    def run(request: Request, form: dict[str, Any]) -> Response:
        with session_scope(_settings(request)) as session:
            account = _session_account(request, session)
            if account is None:
                return PlainTextResponse("login required", status_code=401)
            if not csrf_ok(request, form.get(CSRF_FIELD)):
                return PlainTextResponse("missing or wrong CSRF token", status_code=403)
            return handler(request, session, account, form)

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        form = dict(await request.form())
        return await run_in_threadpool(run, request, form)

    return wrapper


def _not_found() -> PlainTextResponse:
    return PlainTextResponse("not found", status_code=404)


def _int(request: Request, name: str) -> int | None:
    value = request.path_params.get(name)
    return value if isinstance(value, int) else None


def _safe_next(target: str | None) -> str:
    """Only a local path: never send someone off-site after login."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return "/queue"


# -- login ---------------------------------------------------------------------------


def login_form(request: Request) -> Response:
    return _page(request, "login.html", None, next=request.query_params.get("next", ""))


async def login(request: Request) -> Response:
    form = dict(await request.form())
    if not csrf_ok(request, form.get(CSRF_FIELD)):
        return PlainTextResponse("missing or wrong CSRF token", status_code=403)
    name = str(form.get("name", ""))
    password = str(form.get("password", ""))
    address = request.client.host if request.client else "unknown"
    throttle: LoginThrottle = request.app.state.throttle
    if throttle.blocked(name, address):
        return PlainTextResponse("too many failed logins; try again later", status_code=429)

    def check() -> Account | None:
        with session_scope(_settings(request)) as session:
            return authenticate(session, name, password)

    account = await run_in_threadpool(check)
    if account is None:
        throttle.failed(name, address)
        response = _page(request, "login.html", None, next=form.get("next", ""), failed=True)
        response.status_code = 401
        return response
    throttle.succeeded(name)
    request.session.clear()  # a fresh session (and CSRF token) after login
    request.session["user_id"] = account.id
    return RedirectResponse(_safe_next(str(form.get("next", ""))), status_code=303)


@action
def logout(request: Request, session: Session, account: Account, form: dict[str, Any]) -> Response:
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


@page
def next_flag(request: Request, session: Session, account: Account) -> Response:
    filters = Filters.from_query(request.query_params)
    query = urlencode(filters.as_query())
    region_id = next_region(session, account, filters, _settings(request).review_claim_seconds)
    if region_id is None:
        return RedirectResponse(f"/queue?{query}&finished=1", status_code=303)
    return RedirectResponse(f"/regions/{region_id}?{query}", status_code=303)


# -- region --------------------------------------------------------------------------


@page
def region_view(request: Request, session: Session, account: Account) -> Response:
    region_id = _int(request, "region_id")
    detail = region_detail(session, account, region_id) if region_id else None
    if detail is None:
        return _not_found()
    held = claim(session, account, detail.id, _settings(request).review_claim_seconds)
    filters = Filters.from_query(request.query_params)
    return _page(
        request,
        "region.html",
        account,
        region=detail,
        held=held,
        query=urlencode(filters.as_query()),
        error=request.query_params.get("error"),
    )


@resource
def region_page_image(request: Request, session: Session, account: Account) -> Response:
    region_id = _int(request, "region_id")
    detail = region_detail(session, account, region_id) if region_id else None
    if detail is None:
        return _not_found()
    page_image = request.app.state.pages.get(detail.image_uri)
    data = images.page_with_boxes(page_image, [(detail.bbox, "current")])
    return Response(data, media_type="image/jpeg")


@resource
def region_crop(request: Request, session: Session, account: Account) -> Response:
    region_id = _int(request, "region_id")
    detail = region_detail(session, account, region_id) if region_id else None
    if detail is None:
        return _not_found()
    page_image = request.app.state.pages.get(detail.image_uri)
    return Response(images.enlarged_crop(page_image, detail.bbox), media_type="image/png")


@resource
def region_rendered(request: Request, session: Session, account: Account) -> Response:
    region_id = _int(request, "region_id")
    detail = region_detail(session, account, region_id) if region_id else None
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
    except RenderError as error:
        return PlainTextResponse(f"cannot render: {error}", status_code=422)
    return Response(data, media_type="image/png")


@action
def review(request: Request, session: Session, account: Account, form: dict[str, Any]) -> Response:
    region_id = _int(request, "region_id")
    filters = Filters.from_query(request.query_params)
    query = urlencode(filters.as_query())
    choice = str(form.get("action", ""))
    name, _, engine = choice.partition(":")
    try:
        decision = ir.ReviewAction(name)
    except ValueError:
        return PlainTextResponse(f"unknown action {choice!r}", status_code=400)
    try:
        record_review(
            session,
            account,
            region_id or 0,
            decision,
            engine=engine or None,
            text=str(form.get("text", "")),
        )
    except LookupError:
        return _not_found()
    except ClaimedByOther as error:
        return PlainTextResponse(str(error), status_code=409)
    except ReviewRefused as error:
        message = urlencode({"error": str(error)})
        return RedirectResponse(f"/regions/{region_id}?{query}&{message}", status_code=303)
    return RedirectResponse(f"/next?{query}", status_code=303)


# -- document ------------------------------------------------------------------------


@page
def document_view(request: Request, session: Session, account: Account) -> Response:
    document_id = _int(request, "document_id")
    detail = document_detail(session, account, document_id) if document_id else None
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
    document_id = _int(request, "document_id")
    number = _int(request, "number")
    detail = document_detail(session, account, document_id) if document_id else None
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
    if not settings.review_secret:
        raise ConfigurationError(
            "OCRFLEET_REVIEW_SECRET is not set: 32+ random characters that sign session cookies"
        )
    app = Starlette(
        routes=[
            Route("/login", login_form, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/", home, methods=["GET"]),
            Route("/queue", queue, methods=["GET"]),
            Route("/next", next_flag, methods=["GET"]),
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
            Middleware(
                SessionMiddleware,
                secret_key=settings.review_secret,
                session_cookie="ocrfleet_review",
                max_age=settings.review_session_hours * 3600,
                same_site="lax",
                https_only=settings.review_https_only,
            )
        ],
    )
    app.state.settings = settings
    app.state.pages = images.PageImages(settings)
    app.state.throttle = LoginThrottle(
        settings.review_login_attempts, settings.review_login_window_seconds
    )
    return app
