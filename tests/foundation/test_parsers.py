"""The site's JSON parser parses and refuses exactly what DRF's JSONParser does."""
from __future__ import annotations

import io

import pytest
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.settings import api_settings

from orchestrator_site.parsers import JSONBodyParser

BODIES = [
    b'{"input": "hi", "n": 1.5, "list": [1, null, true]}',
    '{"input": "\u00e9t\u00e9 \u2603 \U0001f600"}'.encode(),
    b'{"input": "\\ud83d\\ude00 and a lone \\ud800"}',
    b"[]", b'"just a string"', b"12", b"  {}  ",
    b'{"x": NaN}', b'{"x": Infinity}', b'{"x": -Infinity}',
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    b'{"x": "\xff\xfe"}',  # not UTF-8
    b"", b"{", b'{"a": 1} trailing', b"{'single': 1}", b'{"a": 1,}',
]


def _outcome(parser, body: bytes, context: dict):
    try:
        return ("ok", parser.parse(io.BytesIO(body), "application/json", context))
    except ParseError as exc:
        return ("error", str(exc.detail))


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("context", [{}, {"encoding": "utf-8"}, {"encoding": "latin-1"}, {"encoding": "utf-16"},
                                     {"encoding": "bz2_codec"}, {"encoding": "no-such-charset"}])
@pytest.mark.parametrize("strict", [True, False])
def test_same_result_or_error_as_drf(body, context, strict, monkeypatch):
    monkeypatch.setattr(JSONParser, "strict", strict)
    assert JSONBodyParser.strict is strict
    assert _outcome(JSONBodyParser(), body, context) == _outcome(JSONParser(), body, context)


def test_it_is_the_sites_json_parser():
    assert api_settings.DEFAULT_PARSER_CLASSES[0] is JSONBodyParser
    assert issubclass(JSONBodyParser, JSONParser)  # DRF hands JSON parsers the body as one buffer


def test_a_utf16_body_is_read_with_its_charset():
    body = '{"input": "\u00e9"}'.encode("utf-16")
    assert JSONBodyParser().parse(io.BytesIO(body), "application/json", {"encoding": "utf-16"}) == {"input": "\u00e9"}


# --- chat_app.api.streaming.StreamRequest: a UTF-8 JSON body parsed in one call --------------

CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "application/json;charset=UTF-8",
                 "application/json; charset=latin-1", "application/json; charset=utf-16",
                 "application/json; charset=bz2_codec", "application/json; charset=nope", "application/jsonx",
                 "APPLICATION/JSON", "application/x-www-form-urlencoded", "text/plain", ""]
REQUEST_BODIES = [b'{"input": "hi", "n": [1, 2.5, null]}', '{"input": "\u00e9\u2603"}'.encode(), b"[1]", b"{",
                  b'{"x": NaN}', b"\xef\xbb\xbf{}", b'{"x": "\xff"}', b"a=1&b=2", b""]


def _request_outcome(request_cls, body: bytes, content_type: str, length: str | None, read_first: bool):
    from django.http import QueryDict
    from django.test import RequestFactory
    from rest_framework.exceptions import APIException

    django_request = RequestFactory().generic("POST", "/v1/agent/chat", data=body, content_type=content_type)
    if length is None:
        django_request.META.pop("CONTENT_LENGTH", None)
    else:
        django_request.META["CONTENT_LENGTH"] = length
    if read_first:
        django_request.body  # noqa: B018 - as the streaming views' burst does
    request = request_cls(django_request, parsers=[p() for p in api_settings.DEFAULT_PARSER_CLASSES])
    try:
        data = request.data
    except APIException as exc:
        return ("error", type(exc).__name__, exc.status_code, str(exc.detail))
    if isinstance(data, QueryDict):
        data = ("QueryDict", sorted(data.lists()))
    return ("ok", data, type(request._files).__name__, dict(request._files))


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("body", REQUEST_BODIES)
@pytest.mark.parametrize("length, read_first", [("auto", True), (None, True), ("0", True), ("auto", False),
                                                (None, False), ("0", False), ("x", False)])
def test_stream_request_data_is_drfs(content_type, body, length, read_first):
    from rest_framework.request import Request

    from chat_app.api.streaming import StreamRequest

    length = str(len(body)) if length == "auto" else length
    assert _request_outcome(StreamRequest, body, content_type, length, read_first) == \
        _request_outcome(Request, body, content_type, length, read_first)


def test_stream_request_parses_a_read_utf8_json_body_without_drfs_path(monkeypatch):
    from rest_framework.request import Request

    from chat_app.api.streaming import StreamRequest

    def refuse(self):
        raise AssertionError("DRF's parse path was taken")

    monkeypatch.setattr(Request, "_load_data_and_files", refuse)
    body = b'{"input": "hi"}'
    for content_type in ("application/json", "application/json; charset=utf-8"):
        assert _request_outcome(StreamRequest, body, content_type, str(len(body)), True) == \
            ("ok", {"input": "hi"}, "MultiValueDict", {})
    with pytest.raises(AssertionError, match="DRF's parse path"):  # a body not read yet: DRF's path
        _request_outcome(StreamRequest, body, "application/json", str(len(body)), False)
