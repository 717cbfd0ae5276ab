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
