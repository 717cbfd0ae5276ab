"""The stream lane: token-authenticated requests to the streaming views, served straight from ASGI.

Django's request path — the handler, nine middleware hooks in and out, URL resolution, the
response machinery — was ~15% of the server's CPU under fifty concurrent chat streams (py-spy),
and everything the server spends before a stream's first token delays it. For the requests its
middleware provably does nothing for, the lane skips that path; the view itself (DRF
authentication, permissions, negotiation, parsing, validation, the run, the stream) is exactly
the one Django would call.

A request takes the lane when all of these hold, else it goes to Django unchanged (its body
replayed when the lane already read it):

- its path resolves to a view that asks for the lane (``stream_lane = True`` on the view class:
  :class:`chat_app.api.streaming.AsyncApiView`, the streaming endpoints and run cancel);
- it authenticates with ``Authorization: Token|Bearer <key>`` and carries no ``Cookie``: the
  session, CSRF and authentication middleware have nothing to read or write;
- it carries no ``Origin``: CORS (django-cors-headers) only adds ``Vary: origin`` then;
- its ``Host`` is allowed (``ALLOWED_HOSTS``) and its body is within
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (Django answers 400 and 413 itself);
- the site does not redirect to HTTPS (``SECURE_SSL_REDIRECT``), prepend ``www.``, or refuse user
  agents (``DISALLOWED_USER_AGENTS``).

The lane adds the response headers the middleware would (``X-Frame-Options``,
``X-Content-Type-Options``, ``Referrer-Policy``, ``Cross-Origin-Opener-Policy``, HSTS on HTTPS,
``Vary: origin``, ``Content-Length`` on complete bodies) and sends a streaming view's text frames
itself (the ASGI messages Django's ``send_response`` would send, without its per-chunk generator
layers); ``tests/foundation/test_stream_lane.py``
holds its responses, headers included, equal to Django's for the same requests. A client that
disconnects cancels the response as in Django's handler (the run goes on, per its dialect).
``STREAM_LANE=0`` sends everything through Django.
"""
from __future__ import annotations

import asyncio
import functools
import io
import logging
from contextlib import aclosing
from typing import Any, AsyncIterator, Awaitable, Callable

from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core import signals
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.signals import setting_changed
from django.http import HttpResponseBase
from django.utils.cache import patch_vary_headers
from django.urls import Resolver404, get_resolver, set_script_prefix

logger = logging.getLogger("orchestrator.stream_lane")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_TOKEN_SCHEMES = (b"token ", b"bearer ")


@functools.lru_cache(maxsize=4096)
def _route(path: str) -> tuple[Callable[..., Any], tuple, dict] | None:
    """The view a path resolves to, when that view asks for the lane (cached per path)."""
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return None
    cls = getattr(match.func, "cls", None)
    if not getattr(cls, "stream_lane", False):
        return None
    return match.func, match.args, match.kwargs


def _eligible_headers(scope: Scope) -> bool:
    authorized = False
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorized = value[:7].lower().startswith(_TOKEN_SCHEMES)
        elif name in (b"cookie", b"origin"):
            return False
    return authorized


def _add_site_headers(response: HttpResponseBase, *, secure: bool) -> None:
    """What the middleware adds to a response it passes (SecurityMiddleware, XFrameOptions,
    CommonMiddleware's Content-Length, django-cors-headers' ``Vary`` without an ``Origin``)."""
    headers = response.headers
    for key, value in _site_headers(secure):
        headers.setdefault(key, value)
    if "Vary" in headers:
        patch_vary_headers(response, ("origin",))
    else:
        headers["Vary"] = "origin"  # what patch_vary_headers sets on a response without one
    if not response.streaming:
        headers.setdefault("Content-Length", str(len(response.content)))


@functools.cache
def _site_headers(secure: bool) -> tuple[tuple[str, str], ...]:
    """The middleware's fixed headers, from the settings (computed once; a settings change in
    tests clears this, see ``_settings_changed``)."""
    out = []
    if secure and settings.SECURE_HSTS_SECONDS:
        value = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            value += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            value += "; preload"
        out.append(("Strict-Transport-Security", value))
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        out.append(("X-Content-Type-Options", "nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        values = policy.split(",") if isinstance(policy, str) else policy
        out.append(("Referrer-Policy", ",".join(v.strip() for v in values)))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        out.append(("Cross-Origin-Opener-Policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
    out.append(("X-Frame-Options", getattr(settings, "X_FRAME_OPTIONS", "DENY").upper()))
    return tuple(out)


def _settings_changed(**_: Any) -> None:
    _site_headers.cache_clear()
    _site_allows_lane.cache_clear()
    _HOSTS.clear()


# Raw Host header -> whether Django's ``get_host()`` accepts it (its answer depends on the header
# and the settings alone; with cold caches the check cost ~50 µs a request at one stream at a time).
_HOSTS: dict[str, bool] = {}
MAX_HOSTS = 256


def _host_allowed(request: ASGIRequest) -> bool:
    """Whether ``request.get_host()`` passes, remembered per raw host (at most MAX_HOSTS, then
    forgotten all at once: a client varying its Host header only costs itself the check)."""
    raw = request._get_raw_host()
    allowed = _HOSTS.get(raw)
    if allowed is None:
        try:
            request.get_host()
            allowed = True
        except DisallowedHost:
            allowed = False
        if len(_HOSTS) >= MAX_HOSTS:
            _HOSTS.clear()
        _HOSTS[raw] = allowed
    return allowed


setting_changed.connect(_settings_changed, dispatch_uid="stream-lane-site-headers")


@functools.cache
def _site_allows_lane() -> bool:
    # Read once (cleared with the site headers when a setting changes, see _settings_changed).
    return (getattr(settings, "STREAM_LANE", True) and not settings.SECURE_SSL_REDIRECT
            and not settings.PREPEND_WWW and not settings.DISALLOWED_USER_AGENTS)


class StreamLane:
    """ASGI middleware: the lane for the requests above, ``app`` (Django's handler, which also
    sends the lane's responses) for everything else."""

    def __init__(self, app: ASGIHandler):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _eligible_headers(scope) or not _site_allows_lane():
            return await self.app(scope, receive, send)
        route = _route(scope["path"])
        if route is None:
            return await self.app(scope, receive, send)
        body, more = await _read_body(receive)
        if body is None:
            return  # the client went away before its request was complete
        if more or len(body) > (settings.DATA_UPLOAD_MAX_MEMORY_SIZE or len(body)):
            return await self.app(scope, _replay(body, more, receive), send)  # too large: Django's 413
        request = ASGIRequest(scope, io.BytesIO(body))
        if not _host_allowed(request):
            return await self.app(scope, _replay(body, False, receive), send)  # Django's 400
        async with ThreadSensitiveContext():
            await _serve(self.app, request, route, scope, receive, send)


async def _read_body(receive: Receive) -> tuple[bytes | None, bool]:
    """(body, whether more follows): reading stops at the end or once past the size limit (the
    caller compares); (None, False) when the client went away first."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, False
        chunk = message.get("body", b"")
        parts.append(chunk)
        size += len(chunk)
        more = bool(message.get("more_body"))
        if (limit is not None and size > limit) or not more:
            return b"".join(parts), more


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """``receive`` with the already-read body given back first (as one message)."""
    given = False

    async def replayed() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed


async def _serve(handler: ASGIHandler, request: ASGIRequest, route: tuple, scope: Scope, receive: Receive,
                 send: Send) -> None:
    """The view and its response, in this task (no task of its own: it would start a pass of the
    event loop later, behind every other ready step of a burst); a second task watches for the
    client's ``http.disconnect`` and cancels this one when it comes first."""
    view, args, kwargs = route
    set_script_prefix(get_script_prefix(scope))
    serving = asyncio.current_task()
    gone = False

    def hung_up(watch: asyncio.Task) -> None:
        nonlocal gone
        if not watch.cancelled():
            watch.exception()  # (retrieved: a broken receive means the client is gone too)
            gone = True
            serving.cancel()  # the client went away: the stream's generator closes (see its dialect)

    hangup = asyncio.ensure_future(_disconnected(receive))
    hangup.add_done_callback(hung_up)
    try:
        response = await _respond(handler, view, request, args, kwargs, scope, send)
    except asyncio.CancelledError:
        if not gone or serving.uncancel():
            raise  # cancelled from outside (the server shutting down): as Django's handler
        await signals.request_finished.asend(sender=StreamLane)
        return
    finally:
        hangup.remove_done_callback(hung_up)
        hangup.cancel()
    if gone:  # the client left as the response ended and the view took the cancel: it is spent
        serving.uncancel()
    response.close()  # request_finished: nothing of this request ran in a request thread


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(handler: ASGIHandler, view: Callable[..., Any], request: ASGIRequest, args: tuple, kwargs: dict,
                   scope: Scope, send: Send) -> HttpResponseBase:
    response = await view(request, *args, **kwargs)
    _add_site_headers(response, secure=scope.get("scheme") == "https")
    frames = getattr(response, "text_frames", None)
    if frames is not None and response.streaming:
        await _send_text_frames(response, frames, send)
    else:
        await handler.send_response(response, send)
    return response


async def _send_text_frames(response: HttpResponseBase, frames: AsyncIterator[str], send: Send) -> None:
    """Django's ``ASGIHandler.send_response`` for a streaming view's body of text frames
    (``response.text_frames``, see ``chat_app.api.streaming``): the same messages, without the
    four generator layers and the re-chunking Django puts around each frame (every delta of a
    stream passes them)."""
    headers = [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]
    headers += [(b"Set-Cookie", c.output(header="").encode("ascii").strip()) for c in response.cookies.values()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    charset = response.charset
    async with aclosing(frames):
        async for text in frames:
            await send({"type": "http.response.body", "body": text.encode(charset), "more_body": True})
    await send({"type": "http.response.body"})
