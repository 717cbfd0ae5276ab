"""The site's JSON request parser: DRF's ``JSONParser``, without its per-request set-up.

DRF's parser wraps the body in a ``codecs`` stream reader and calls ``json.load`` with a
``parse_constant``, which builds a new ``JSONDecoder`` for every request: together a third of a
stream request's parse time. :class:`JSONBodyParser` decodes a UTF-8 body (the default charset,
and what every client here sends) in one call and reuses one decoder; other charsets go through
DRF's own code. What it accepts, what it returns and the errors it raises are
DRF's (``tests/foundation/test_parsers.py`` holds them equal): ``NaN`` and ``Infinity`` are
refused under ``STRICT_JSON`` (DRF's default), a UTF-8 byte order mark is refused as
``json.loads`` refuses it, a charset that is not a text encoding is refused by DRF's own check
(``get_encoding``), and every failure is DRF's ``ParseError`` (400 ``parse_error``).
"""
from __future__ import annotations

import json

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils.json import strict_constant

_STRICT = json.JSONDecoder(parse_constant=strict_constant)
_LENIENT = json.JSONDecoder()
_UTF8 = ("utf-8", "utf8", "utf_8")


class JSONBodyParser(JSONParser):
    """``application/json`` bodies, as DRF's ``JSONParser`` parses them (see the module docstring)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})  # DRF's: text encodings only (no bz2_codec bombs)
        if not self.is_utf8(encoding):
            # Other charsets (a UTF-16 body, say) decode through DRF's stream reader, which
            # differs from bytes.decode at the edges (a missing byte order mark).
            return super().parse(stream, media_type, parser_context)
        try:
            return self.parse_utf8(stream.read())
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}")

    def parse_utf8(self, body: bytes):
        """A UTF-8 body's value; ``ValueError`` (``UnicodeDecodeError``, ``JSONDecodeError``)
        where :meth:`parse` raises its ``ParseError``."""
        text = body.decode("utf-8")
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return (_STRICT if self.strict else _LENIENT).decode(text)

    @staticmethod
    def is_utf8(encoding: str) -> bool:
        return encoding.lower() in _UTF8
