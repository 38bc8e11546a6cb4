"""Security headers on every response of the review app: a Content-Security-Policy that
runs only the page's own nonced script and style, no framing, no MIME sniffing, no
referrer beyond the origin, and nothing kept in caches (pages and images are tenant data).
"""

from __future__ import annotations

import secrets

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_NONCE = "ocrfleet.csp_nonce"
CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def csp_nonce(request: Request) -> str:
    """This response's nonce, for the templates' <script> and <style>."""
    return str(request.scope.get(_NONCE, ""))


class SecurityHeaders:
    """ASGI middleware: a fresh nonce per request, the headers on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = scope[_NONCE] = secrets.token_urlsafe(16)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = CSP.format(nonce=nonce)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
