"""Content negotiation of the streaming views: DRF's choice, remembered per Accept header."""
from __future__ import annotations

import pytest
from django.test import RequestFactory
from rest_framework.exceptions import NotAcceptable
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from chat_app.api.streaming import DialectNegotiation, EventStreamRenderer


@pytest.fixture
def negotiation():
    DialectNegotiation._chosen.clear()
    yield DialectNegotiation()
    DialectNegotiation._chosen.clear()


def _choose(negotiation, accept: str | None, renderers=None):
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    request = Request(RequestFactory().post("/v1/agent/chat", **headers))
    renderer, media_type = negotiation.select_renderer(request, renderers or [JSONRenderer(), EventStreamRenderer()])
    return type(renderer), media_type


@pytest.mark.parametrize("accept, chosen, media_type", [
    ("text/event-stream", EventStreamRenderer, "text/event-stream"),
    ("application/json", JSONRenderer, "application/json"),
    ("*/*", JSONRenderer, "application/json"),
    (None, JSONRenderer, "application/json"),
    ("text/html, text/event-stream;q=0.9", EventStreamRenderer, "text/event-stream;q=0.9"),
])
def test_the_choice_is_drfs_the_first_time_and_again(negotiation, accept, chosen, media_type):
    first = _choose(negotiation, accept)
    assert first == (chosen, media_type)
    assert len(DialectNegotiation._chosen) == 1
    assert _choose(negotiation, accept) == first  # now from memory
    # The memory is per header: another header is negotiated on its own.
    other = "application/json" if chosen is EventStreamRenderer else "text/event-stream"
    assert _choose(negotiation, other)[0] is not chosen


def test_the_renderers_are_part_of_the_key(negotiation):
    assert _choose(negotiation, "*/*")[0] is JSONRenderer
    assert _choose(negotiation, "*/*", renderers=[EventStreamRenderer(), JSONRenderer()])[0] is EventStreamRenderer


def test_an_unacceptable_header_is_refused_every_time_and_not_remembered(negotiation):
    for _ in range(2):
        with pytest.raises(NotAcceptable):
            _choose(negotiation, "text/html")
    assert DialectNegotiation._chosen == {}


def test_memory_is_bounded(negotiation, monkeypatch):
    monkeypatch.setattr(DialectNegotiation, "MAX_REMEMBERED", 3)
    for i in range(7):
        assert _choose(negotiation, f"application/json; v={i}")[0] is JSONRenderer
    assert 1 <= len(DialectNegotiation._chosen) <= 3


def _parser_for(negotiation, content_type: str | None, parsers):
    headers = {} if content_type is None else {"content_type": content_type}
    request = Request(RequestFactory().post("/v1/agent/chat", data=b"{}", **headers))
    chosen = negotiation.select_parser(request, parsers)
    return None if chosen is None else type(chosen)


@pytest.fixture
def parsers():
    from rest_framework.parsers import FormParser, MultiPartParser

    from orchestrator_site.parsers import JSONBodyParser

    DialectNegotiation._parsers.clear()
    yield [JSONBodyParser(), FormParser(), MultiPartParser()]
    DialectNegotiation._parsers.clear()


@pytest.mark.parametrize("content_type", [
    "application/json", "application/json; charset=utf-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", "text/plain", "application/jsonx", "x" * 300,
])
def test_the_parser_is_drfs_the_first_time_and_again(negotiation, parsers, content_type):
    from rest_framework.negotiation import DefaultContentNegotiation

    expected = _parser_for(DefaultContentNegotiation(), content_type, parsers)
    assert _parser_for(negotiation, content_type, parsers) is expected
    assert _parser_for(negotiation, content_type, parsers) is expected  # now from memory, if it was one
    assert len(DialectNegotiation._parsers) == (0 if expected is None else 1)
    if expected is not None:  # the memory is per parser list too
        assert _parser_for(negotiation, content_type, parsers[::-1]) is _parser_for(
            DefaultContentNegotiation(), content_type, parsers[::-1])


def test_parser_memory_is_bounded(negotiation, parsers, monkeypatch):
    monkeypatch.setattr(DialectNegotiation, "MAX_REMEMBERED", 3)
    for i in range(7):
        assert _parser_for(negotiation, f"application/json; v={i}", parsers).__name__ == "JSONBodyParser"
    assert 1 <= len(DialectNegotiation._parsers) <= 3
