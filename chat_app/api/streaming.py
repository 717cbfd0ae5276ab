"""Async views for the streaming endpoints: one short burst of database work, then the stream.

:class:`AsyncApiView` is a DRF ``APIView`` for what DRF does well — authentication (token or
session with CSRF), parsing, validation, error mapping and the OpenAPI schema — but it is
dispatched as a coroutine. The request's work (authenticate, parse, validate, prepare the run)
is one burst (:meth:`AsyncApiView.burst`): on the event loop when everything it reads is cached,
else in ONE database-pool call; the run's rows are written by the group-commit writer beside the
provider call. Then the view streams from the event loop. An open stream therefore holds no
thread and no database connection, and requests do not queue behind each other on one shared
ORM thread.

:meth:`AsyncApiView.stream` is the one way a run is streamed over HTTP: any registered dialect,
through :func:`chat_app.transports.stream_run` (pings, resume, coalescing, disconnect policy).
"""
from __future__ import annotations

import asyncio
import functools
import logging
from contextlib import aclosing
from types import SimpleNamespace
from typing import Any, Callable

from asgiref.sync import SyncToAsync, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import SynchronousOnlyOperation
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.datastructures import MultiValueDict
from rest_framework import exceptions as drf_exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Empty, Request
from rest_framework.views import APIView

from chat_app import services
from chat_app.eventlog import in_thread
from chat_app.executor import get_executor
from chat_app.transports import Dialect, detach, stream_run
from core.errors import ApplicationError
from orchestrator_site.errors import exception_handler
from orchestrator_site.parsers import JSONBodyParser

logger = logging.getLogger("orchestrator.transports")

SSE_HEADERS = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}


class EventStreamRenderer(BaseRenderer):
    """Lets DRF content negotiation accept ``Accept: text/event-stream`` (errors stay JSON)."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return JSONRenderer().render(data)


class DialectNegotiation(DefaultContentNegotiation):
    """DRF's content negotiation, remembered per ``Accept`` header (and parser selection per
    ``Content-Type``).

    ``?format=`` names a stream dialect here, not a DRF renderer, so DRF must ignore it; the
    choice then depends only on the header, a format suffix and the renderers, and parsing the
    header (a tenth of a stream request's view time) is done once per distinct header. At most
    :attr:`MAX_REMEMBERED` headers are kept (then forgotten all at once, so a client varying the
    header costs itself the parse, nothing more); a header nothing accepts is never remembered.
    """

    settings = SimpleNamespace(URL_FORMAT_OVERRIDE=None)
    MAX_REMEMBERED = 256
    _chosen: dict[tuple[Any, ...], tuple[int, str]] = {}
    _parsers: dict[tuple[Any, ...], int] = {}

    def select_parser(self, request: Request, parsers: list[Any]):
        """DRF's parser for the request's ``Content-Type``, remembered the same way (a type no
        parser takes is a 415 every time, never remembered)."""
        def choose() -> int | None:
            parser = super(DialectNegotiation, self).select_parser(request, parsers)
            return None if parser is None else parsers.index(parser)

        index = self._remember(self._parsers, (request.content_type, *map(type, parsers)), choose)
        return None if index is None else parsers[index]

    def select_renderer(self, request: Request, renderers: list[BaseRenderer], format_suffix: str | None = None):
        def choose() -> tuple[int, str]:  # raises NotAcceptable (never remembered)
            renderer, media_type = super(DialectNegotiation, self).select_renderer(request, renderers, format_suffix)
            return renderers.index(renderer), media_type

        key = (request._request.META.get("HTTP_ACCEPT", "*/*"), format_suffix, *map(type, renderers))
        index, media_type = self._remember(self._chosen, key, choose)
        return renderers[index], media_type

    @classmethod
    def _remember(cls, table: dict[tuple[Any, ...], Any], key: tuple[Any, ...], choose: Callable[[], Any]) -> Any:
        """``table[key]``, else ``choose()`` kept there (unless None); at most MAX_REMEMBERED keys."""
        hit = table.get(key)
        if hit is None:
            hit = choose()
            if hit is not None:
                if len(table) >= cls.MAX_REMEMBERED:
                    table.clear()
                table[key] = hit
        return hit


class StreamRequest(Request):
    """DRF's ``Request``, with the body every streaming client sends — UTF-8 JSON — parsed in
    one call.

    DRF's ``request.data`` for such a body (the content type, the stream, the parser's
    selection, a ``BytesIO`` over the body, the parser) was a fifth of a chat start's view time.
    When DRF would hand a non-empty body to the site's JSON parser with a UTF-8 charset, this
    parses it with that parser's own decoding (:meth:`JSONBodyParser.parse_utf8`); anything else
    — another content type, no ``Content-Length``, another charset, an unread body, a body that
    does not parse — goes through DRF's own code, which then answers (415, 400 ``parse_error``)
    as it always does. ``tests/foundation/test_parsers.py`` holds the two equal.
    """

    def _load_data_and_files(self) -> None:
        if self._data is Empty:
            data = self._utf8_json()
            if data is not Empty:
                self._data = self._full_data = data
                self._files = MultiValueDict()
                return
        super()._load_data_and_files()

    def _utf8_json(self) -> Any:
        """The body's value when DRF would parse it with the site's JSON parser as UTF-8, else ``Empty``."""
        request = self._request
        meta = request.META
        content_type = meta.get("CONTENT_TYPE", meta.get("HTTP_CONTENT_TYPE", ""))
        if not (content_type == "application/json" or content_type.startswith("application/json;")):
            return Empty
        try:  # DRF reads no body without a Content-Length (its data is then {})
            if int(meta.get("CONTENT_LENGTH", meta.get("HTTP_CONTENT_LENGTH", 0))) <= 0:
                return Empty
        except (ValueError, TypeError):
            return Empty
        body = request.__dict__.get("_body")
        parser = self.parsers[0] if self.parsers else None
        if body is None or not isinstance(parser, JSONBodyParser) or \
                not parser.is_utf8(self.parser_context.get("encoding") or settings.DEFAULT_CHARSET):
            return Empty
        try:
            return parser.parse_utf8(body)
        except ValueError:
            return Empty  # DRF's path raises its ParseError


class AsyncApiView(APIView):
    """An APIView whose handlers are coroutines; see the module docstring."""

    renderer_classes = [JSONRenderer, EventStreamRenderer]
    content_negotiation_class = DialectNegotiation
    # Token-authenticated requests reach these views by the stream lane (orchestrator_site/stream_lane.py).
    stream_lane = True

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Callable[..., Any]:
        async def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return await cls(**initkwargs).adispatch(request, *args, **kwargs)

        view.cls = cls  # drf-spectacular documents the view from its class
        view.initkwargs = initkwargs
        view.csrf_exempt = True  # like every APIView: session-authenticated requests are checked below
        markcoroutinefunction(view)
        return view

    async def adispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        self.args, self.kwargs, self.headers = args, kwargs, {}
        method = (request.method or "").lower()
        handler = getattr(self, method, None) if method in self.http_method_names else None
        if method == "options":
            handler = self._options  # DRF's options() is sync and returns a DRF Response
        if handler is None:
            response = JsonResponse({"code": "method_not_allowed", "message": f"Method {request.method} not allowed."},
                                    status=405)
            response["Allow"] = ", ".join(self.allowed_methods)
            return response
        try:
            return await handler(request, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure is a JSON error, never an HTML page
            return self._error_response(exc)

    async def _options(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """``OPTIONS``: DRF's metadata for the view (after authentication, as DRF does), and ``Allow``."""
        data = await self.burst(lambda drf_request: self.metadata_class().determine_metadata(drf_request, self), request)
        response = JsonResponse(data, json_dumps_params={"ensure_ascii": False})
        response["Allow"] = ", ".join(self.allowed_methods)
        return response

    def initialize_request(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Request:
        """DRF's, as a :class:`StreamRequest`."""
        return StreamRequest(request, parsers=self.get_parsers(), authenticators=self.get_authenticators(),
                             negotiator=self.get_content_negotiator(), parser_context=self.get_parser_context(request))

    # --- the burst ---------------------------------------------------------------------------
    def authenticated(self, request: HttpRequest) -> Request:
        """(In the burst.) The DRF request, authenticated and permission-checked; ``.data`` parses."""
        drf_request = self.initialize_request(request, *self.args, **self.kwargs)
        self.request = drf_request
        self.initial(drf_request, *self.args, **self.kwargs)
        return drf_request

    async def burst(self, work: Callable[..., Any], request: HttpRequest) -> Any:
        """Run ``work(drf_request)`` after authentication, without a thread when it can.

        First on the event loop: a request that needs no database read (a cached token, a new
        conversation, cached agent and providers: the common chat start) is served there, with
        no thread hop; its rows are written later by the group-commit writer. The first thing
        that would block — the ORM, a provider probe — raises ``SynchronousOnlyOperation``
        before anything was changed (``work`` only reads until it returns), and the whole burst
        runs again in one database-pool call.
        """
        request.body  # noqa: B018 - read once (it is in memory), so both attempts parse the same bytes
        try:
            return work(self.authenticated(request))
        except SynchronousOnlyOperation:
            pass
        return await in_thread(lambda: work(self.authenticated(request)))()

    # --- streaming ---------------------------------------------------------------------------
    def stream(self, dialect_cls: type[Dialect], *, run_id: str, conversation_id: str, user: Any = None,
               after_seq: int = 0, hold: float = 0.0, **options: Any) -> StreamingHttpResponse:
        """A run's events (after ``after_seq``) as ``dialect_cls`` frames, until the run ends."""
        dialect = dialect_cls(run_id=run_id, conversation_id=conversation_id, after_seq=after_seq, **options)
        subscription = get_executor().subscribe(run_id, after_seq=after_seq)
        on_abandon = functools.partial(_cancel_abandoned, user=user, run_id=run_id) if dialect.cancel_on_disconnect else None
        frames = stream_run(dialect, subscription, ping_interval=float(settings.SSE_PING_INTERVAL),
                            on_abandon=on_abandon, hold=hold)

        async def body():
            release_request_thread()  # the middleware is done with the response by now
            async with aclosing(frames):
                async for batch in frames:
                    yield "".join(map(dialect.encode, batch))

        text_frames = body()
        response = StreamingHttpResponse(text_frames, content_type=dialect.media_type,
                                         charset=_charset_of(dialect.media_type))
        # The stream lane sends these itself, without Django's per-chunk layers (orchestrator_site/stream_lane.py).
        response.text_frames = text_frames
        for key, value in {**SSE_HEADERS, **dialect.headers, "X-Run-Id": run_id,
                           "X-Conversation-Id": conversation_id}.items():
            response[key] = value
        return response

    async def start_stream(self, created: "services.RunCreated", dialect_cls: type[Dialect], *, user: Any = None,
                           **options: Any) -> StreamingHttpResponse:
        """Hand a created run to the executor and stream it: every run-starting endpoint ends here.

        The run's task goes first: it builds and sends the provider request. The response — its
        head, the opening frames — is set up only when the run has its first output (or ended),
        up to ``STREAM_OPENING_HOLD`` seconds, and leaves with that output in one write, as a
        bare relay has it: under many concurrent starts no stream's set-up stands ahead of
        another stream's provider request, and the woken request runs right after the run's
        step that published (``core.scheduling``). A client that leaves meanwhile cancels the
        run when its dialect says so, as it would mid-stream.
        """
        executor = get_executor()
        executor.submit(created.launch)
        run_id = created.launch.run_id  # not created.run: its rows are built later, off the loop
        loop = asyncio.get_running_loop()
        hold = float(settings.STREAM_OPENING_HOLD)
        hold_until = loop.time() + hold
        try:
            if hold > 0:
                await executor.wait_output(run_id, timeout=hold)
            else:
                await asyncio.sleep(0)  # the run's task still goes first
        except asyncio.CancelledError:
            if dialect_cls.cancel_on_disconnect:
                detach(_cancel_abandoned(user=user, run_id=run_id))
            raise
        # With what remains of the hold, the opening frames and the first batch (here by now,
        # unless the hold ran out) leave as one write.
        return self.stream(dialect_cls, run_id=run_id, conversation_id=created.launch.conversation_id,
                           conversation_created=created.conversation_created, user=user,
                           hold=max(0.0, hold_until - loop.time()), **options)

    # --- errors ------------------------------------------------------------------------------
    def _error_response(self, exc: Exception) -> HttpResponse:
        if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
            header = self.get_authenticate_header(getattr(self, "request", None) or Request(HttpRequest()))
            if header:
                exc.auth_header = header
            else:
                exc.status_code = 403
        handled = exception_handler(exc, {"view": self})
        if handled is None:
            logger.exception("unhandled error in streaming view", exc_info=exc)
            return JsonResponse({"code": "internal_error", "message": "Internal server error."}, status=500)
        response = JsonResponse(handled.data, status=handled.status_code, json_dumps_params={"ensure_ascii": False})
        for key in ("WWW-Authenticate", "Retry-After"):
            if handled.has_header(key):
                response[key] = handled[key]
        return response


@functools.cache
def _charset_of(media_type: str) -> str:
    """A dialect's charset, read by Django from its media type once (not on every response)."""
    return HttpResponse(content_type=media_type).charset


def release_request_thread() -> None:
    """Let the request's sync thread go for the length of a stream.

    Django serves each ASGI request inside asgiref's ``ThreadSensitiveContext``, whose executor —
    one thread, started for the ``request_started`` signal and used again by the middleware on the
    response — lives until the response ends: for a stream, as long as the stream. Once the body
    starts, nothing thread-sensitive runs until it ends, so the thread is released then; a call at
    the very end (closing the response) gets a fresh one, which the context shuts down as usual.
    """
    try:
        context = SyncToAsync.thread_sensitive_context.get()
    except LookupError:
        return
    executor = SyncToAsync.context_to_thread_executor.pop(context, None)
    if executor is not None:
        executor.shutdown(wait=False)


async def _cancel_abandoned(*, user: Any, run_id: str) -> None:
    """A client of a ``cancel_on_disconnect`` dialect left before the end: cancel its run."""
    await get_executor().wait_recorded(run_id)  # a run whose commit is still landing is cancelled too
    await _cancel_quietly(user=user, run_id=run_id)


async def _cancel_quietly(*, user: Any, run_id: str) -> None:
    try:
        await services.run_cancel(user=user, run_id=run_id)
        logger.info("stream for run %s closed early: run cancelled", run_id)
    except ApplicationError:
        pass  # already finished (Conflict) or gone: nothing to cancel
