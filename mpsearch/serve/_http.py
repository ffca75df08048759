"""HTTP plumbing of ``mpsearch serve``: error responses, the request guard, error handlers.

Consumes requests and exceptions; produces responses: JSON ``{"error": message}`` for API
clients and an HTML page otherwise, one line each (a traceback only reaches the server log).
:class:`Guard` applies the access rules of :mod:`mpsearch.serve._access` (token, Host,
cross-site: 400/403), caps request bodies (413), their pauses and their rate (408) and adds
the security headers to every response, refusals included, with a content security policy
that lets pages load nothing from other origins.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mpsearch.errors import MpsearchError
from mpsearch.serve import _pages as pages
from mpsearch.serve._access import Access
from mpsearch.serve._store import UploadError

__all__ = ["BODY_IDLE_S", "BODY_MIN_RATE", "CSP", "Guard", "error_handlers", "error_response",
           "wants_json"]

logger = logging.getLogger("mpsearch.serve")

CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' "
       "'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'self'; object-src 'none'; base-uri 'none'; form-action 'self'")
_FORM_SLACK = 64 * 1024  # multipart headers and small fields around the file
#: Longest wait for the next piece of a request body (the header timeout is the server's:
#: see :mod:`mpsearch.cli._serve`).
BODY_IDLE_S = 30.0
#: Slowest average rate a request body may come at, after its first BODY_IDLE_S seconds.
BODY_MIN_RATE = 10_000.0


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return request.url.path.startswith("/api/") or (
        "application/json" in accept and "text/html" not in accept)


def error_response(request: Request, message: str, status: int) -> Response:
    if wants_json(request):
        return JSONResponse({"error": message}, status_code=status)
    return HTMLResponse(pages.error_page(message, status), status_code=status)


class Guard:
    """ASGI middleware: access rules, body size limit, security headers."""

    def __init__(self, app: ASGIApp, max_bytes: int, access: Access) -> None:
        self.app, self.max_bytes, self.access = app, max_bytes, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        cookie: str | None = None
        started = False

        async def headers(msg: Message) -> None:  # security headers on every response
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                msg["headers"] = [*msg.get("headers", []),
                                  (b"content-security-policy", CSP.encode()),
                                  (b"x-content-type-options", b"nosniff"),
                                  (b"x-frame-options", b"SAMEORIGIN"),
                                  (b"referrer-policy", b"same-origin"),
                                  (b"cross-origin-opener-policy", b"same-origin"),
                                  (b"cross-origin-resource-policy", b"same-origin")]
                if cookie is not None:
                    msg["headers"].append((b"set-cookie", cookie.encode()))
            await send(msg)

        message = self._refuse(request)
        if message is not None:
            status, text = message
            await error_response(request, text, status)(scope, receive, headers)
            return
        query = request.query_params
        if self.access.token is not None and query.get("token") == self.access.token:
            cookie = self.access.set_cookie()  # the first visit: keep the token in a cookie
            if request.method == "GET" and not wants_json(request):
                kept = urlencode([(k, v) for k, v in query.multi_items() if k != "token"])
                response = RedirectResponse(request.url.path + (f"?{kept}" if kept else ""),
                                            status_code=303)
                await response(scope, receive, headers)
                return
        limit, seen, first = self.max_bytes + _FORM_SLACK, 0, 0.0

        async def limited() -> Message:
            nonlocal seen, first
            now = asyncio.get_running_loop().time()
            first = first or now
            # a body that pauses, or trickles, holds a connection and a worker thread
            wait = min(BODY_IDLE_S, first + BODY_IDLE_S + seen / BODY_MIN_RATE - now)
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, wait))
            except asyncio.TimeoutError:
                raise _Stalled from None
            seen += len(msg.get("body", b""))
            if seen > limit:
                raise _TooLarge
            return msg

        try:
            await self.app(scope, limited, headers)
        except _TooLarge:
            if not started:
                await error_response(request, self._too_large(), 413)(scope, receive, headers)
        except _Stalled:
            if not started:
                await error_response(
                    request, f"the request body paused for {BODY_IDLE_S:.0f} s or came slower "
                    f"than {BODY_MIN_RATE / 1000:.0f} kB/s; send it again", 408,
                )(scope, receive, headers)

    def _too_large(self) -> str:
        return (f"upload too large: the limit is {self.max_bytes / 1e6:.1f} MB; restart "
                "`mpsearch serve` with a larger --max-upload-mb")

    def _refuse(self, request: Request) -> tuple[int, str] | None:
        refused = self.access.refuse(request.method, request.url.path, request.query_params,
                                     request.headers, request.cookies)
        if refused is not None:
            return refused
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes + _FORM_SLACK:
            return 413, self._too_large()
        return None


class _TooLarge(Exception):
    pass


class _Stalled(Exception):
    pass


def error_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Exception handlers: a user error is its one-line message, anything else a generic
    message (the traceback goes to the server log only)."""

    async def user_error(request: Request, exc: Exception) -> Response:
        status = exc.status if isinstance(exc, UploadError) else 400
        text = str(exc).splitlines()[0] if str(exc) else "bad request"
        return error_response(request, text, status)

    async def http_error(request: Request, exc: Exception) -> Response:
        return error_response(request, str(getattr(exc, "detail", "") or "bad request"),
                              int(getattr(exc, "status_code", 400)))

    async def internal(request: Request, exc: Exception) -> Response:
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(request, f"internal error ({type(exc).__name__}); the server "
                              "log has the details", 500)

    return {MpsearchError: user_error, HTTPException: http_error, Exception: internal}
