"""``web_fetch``: fetch an http(s) URL and return its text, refusing internal addresses.

Every hop (the URL and each redirect, at most ``MAX_REDIRECTS``) goes through
:func:`check_url`: the scheme must be http or https, and *every* address the host resolves to
must be public, i.e. not loopback, private, link-local, multicast, reserved, unspecified or shared
(``WEB_FETCH_ALLOW_PRIVATE`` lifts that for development and tests). The cloud metadata address
169.254.169.254 is refused even then: nothing legitimate is fetched from it.

Against DNS rebinding, the connection goes to the address that was checked: a per-hop adapter
pins urllib3's socket to that IP while the URL keeps its host name, so the Host header, TLS SNI
and certificate check still use the name. Proxies from the environment are ignored (a proxy
would make the check meaningless).
"""
from __future__ import annotations

import asyncio
import html
import ipaddress
import re
import socket
import time
from dataclasses import dataclass
from email.message import Message
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from .. import conf
from ..registry import Tool, ToolContext, ToolError, ToolResult
from ..sandbox import truncate_text
from ._base import string_arg, tool_errors_as_results

MAX_REDIRECTS = 5
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
_REDIRECT_CODES = {301, 302, 303, 307, 308}
_CHUNK = 65536
_USER_AGENT = "orchestrator-web-fetch/1.0"


class WebFetchTool(Tool):
    name = "web_fetch"
    description = (
        "Fetch a public web page or file over http or https (GET) and return its text: HTML is "
        "reduced to its visible text, other text types are returned as is, binary content is "
        "only described. Redirects are followed (at most 5). Addresses on private, loopback or "
        "link-local networks are refused. Large responses are cut at a size limit, which the "
        "output says."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "Absolute http:// or https:// URL to fetch."},
        },
        "required": ["url"],
        "additionalProperties": False,
    }

    @tool_errors_as_results
    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        url = string_arg(input, "url").strip()
        timeout = float(conf.setting("WEB_FETCH_TIMEOUT", 10))
        max_bytes = int(conf.setting("WEB_FETCH_MAX_BYTES", 1_000_000))
        allow_private = bool(conf.setting("WEB_FETCH_ALLOW_PRIVATE", False))

        def fetch_and_render() -> tuple[FetchedPage, str]:
            # Parsing a large HTML page is CPU work too: keep it off the event loop.
            page = fetch(url, timeout=timeout, max_bytes=max_bytes, allow_private=allow_private)
            return page, page.text()

        page, text = await asyncio.to_thread(fetch_and_render)
        body, cut = truncate_text(text, int(conf.setting("TOOL_OUTPUT_LIMIT", 50_000)))
        lines = [f"URL: {page.url}", f"Status: {page.status}", f"Content-Type: {page.content_type or 'unknown'}"]
        if page.truncated:
            lines.append(f"[response truncated: only the first {page.bytes_read} bytes were read]")
        output = "\n".join(lines) + "\n\n" + body
        metadata = {"url": page.url, "status": page.status, "truncated": page.truncated or cut}
        return ToolResult(output, is_error=not 200 <= page.status < 300, metadata=metadata)


@dataclass(frozen=True)
class FetchedPage:
    url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool

    @property
    def bytes_read(self) -> int:
        return len(self.body)

    def text(self) -> str:
        """The body as text: HTML stripped to visible text; binary types only described."""
        mime = self.content_type.split(";")[0].strip().lower()
        if mime and not _is_textual(mime):
            return f"[binary content ({mime}, {len(self.body)} bytes) not shown]"
        try:
            text = self.body.decode(self.charset or "utf-8", errors="replace")
        except LookupError:
            text = self.body.decode("utf-8", errors="replace")
        if mime in ("text/html", "application/xhtml+xml") or (not mime and _looks_like_html(text)):
            return html_to_text(text)
        return text


def check_url(url: str, *, allow_private: bool) -> str:
    """Validate one hop and return the IP address to connect to.

    Raises:
        ToolError: not http(s), no host, the host does not resolve, or any of its addresses is
            not allowed.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ToolError(f"only http and https URLs can be fetched, not {parts.scheme or 'a relative URL'!r}")
    host = parts.hostname
    if not host:
        raise ToolError(f"URL has no host: {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ToolError(f"invalid port in URL {url!r}") from exc

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"could not resolve host {host!r}: {exc}") from exc
    addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    if not addresses:
        raise ToolError(f"could not resolve host {host!r}")
    for address in addresses:
        reason = forbidden_reason(address, allow_private=allow_private)
        if reason:
            raise ToolError(f"refusing to fetch {url}: {host} resolves to {address}, {reason}")
    return str(addresses[0])


def forbidden_reason(address: ipaddress.IPv4Address | ipaddress.IPv6Address, *, allow_private: bool) -> str | None:
    """Why ``address`` may not be fetched from, or ``None`` if it may."""
    mapped = getattr(address, "ipv4_mapped", None) or getattr(address, "sixtofour", None)
    if mapped is not None:
        return forbidden_reason(mapped, allow_private=allow_private)
    if address in METADATA_ADDRESSES:
        return "the cloud metadata address"
    if allow_private:
        return None
    for attribute, label in (
        # Most specific first: ``is_private`` also covers loopback, link-local and unspecified.
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_unspecified", "an unspecified address"),
        ("is_multicast", "a multicast address"),
        ("is_private", "a private address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(address, attribute):
            return label
    if not address.is_global:
        return "not a public address"
    return None


def fetch(url: str, *, timeout: float, max_bytes: int, allow_private: bool) -> FetchedPage:
    """GET ``url``, checking and pinning every hop; read at most ``max_bytes`` of the body."""
    deadline = time.monotonic() + timeout
    for _hop in range(MAX_REDIRECTS + 1):
        address = check_url(url, allow_private=allow_private)
        with requests.Session() as session:
            session.trust_env = False
            adapter = _PinnedAdapter(address)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            try:
                resp = session.get(
                    url,
                    stream=True,
                    allow_redirects=False,
                    timeout=_remaining(deadline),
                    headers={"User-Agent": _USER_AGENT, "Accept": "text/html,text/plain,*/*;q=0.8"},
                )
            except requests.RequestException as exc:
                raise ToolError(f"could not fetch {url}: {exc}") from exc
            with resp:
                location = resp.headers.get("Location")
                if resp.status_code in _REDIRECT_CODES and location:
                    url = urljoin(url, location)
                    continue
                body, truncated = _read_body(resp, max_bytes, deadline)
                content_type = resp.headers.get("Content-Type", "")
                return FetchedPage(
                    url=url,
                    status=resp.status_code,
                    content_type=content_type,
                    charset=_charset(content_type),
                    body=body,
                    truncated=truncated,
                )
    raise ToolError(f"too many redirects (more than {MAX_REDIRECTS}), last to {url}")


def html_to_text(markup: str) -> str:
    """Roughly the visible text of an HTML document: no tags, scripts or styles."""
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    text = html.unescape("".join(parser.parts))
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    text = re.sub(r" *\n[ \n]*", "\n", text)
    return text.strip()


class _TextExtractor(HTMLParser):
    _HIDDEN = {"script", "style", "noscript", "template"}
    _BLOCK = {"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer",
              "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "title", "hr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.parts: list[str] = []
        self._hidden_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._HIDDEN:
            self._hidden_depth += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN:
            self._hidden_depth = max(0, self._hidden_depth - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._hidden_depth:
            self.parts.append(data)

    def handle_entityref(self, name: str) -> None:
        self.handle_data(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self.handle_data(f"&#{name};")


def _pinned_connection(base: type[HTTPConnection], address: str) -> type[HTTPConnection]:
    class PinnedConnection(base):  # type: ignore[misc, valid-type]
        def _new_conn(self):  # type: ignore[no-untyped-def]
            # urllib3 dials ``_dns_host``; point it at the checked address for the connect only,
            # so Host, SNI and certificate checks keep the name.
            name = self._dns_host
            self._dns_host = address
            try:
                return super()._new_conn()
            finally:
                self._dns_host = name

    return PinnedConnection


class _PinnedAdapter(HTTPAdapter):
    """An adapter whose connections all go to one IP address."""

    def __init__(self, address: str) -> None:
        self._address = address  # set before super().__init__, which builds the pool manager
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        http_pool = type("PinnedHTTPPool", (HTTPConnectionPool,),
                         {"ConnectionCls": _pinned_connection(HTTPConnection, self._address)})
        https_pool = type("PinnedHTTPSPool", (HTTPSConnectionPool,),
                          {"ConnectionCls": _pinned_connection(HTTPSConnection, self._address)})
        # A fresh dict: the default one is shared module state in urllib3.
        self.poolmanager.pool_classes_by_scheme = {"http": http_pool, "https": https_pool}


def _read_body(resp: requests.Response, max_bytes: int, deadline: float) -> tuple[bytes, bool]:
    body = bytearray()
    try:
        for chunk in resp.iter_content(_CHUNK):
            body.extend(chunk)
            if len(body) > max_bytes:
                return bytes(body[:max_bytes]), True
            if time.monotonic() > deadline:
                raise ToolError(f"timed out reading {resp.url} after {len(body)} bytes")
    except requests.RequestException as exc:
        raise ToolError(f"could not read {resp.url}: {exc}") from exc
    return bytes(body), False


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ToolError("timed out")
    return remaining


def _charset(content_type: str) -> str | None:
    if not content_type:
        return None
    message = Message()
    message["Content-Type"] = content_type
    return message.get_content_charset()


def _is_textual(mime: str) -> bool:
    return (
        mime.startswith("text/")
        or mime in ("application/json", "application/xml", "application/javascript", "application/xhtml+xml")
        or mime.endswith(("+json", "+xml"))
    )


def _looks_like_html(text: str) -> bool:
    return text.lstrip()[:15].lower().startswith(("<!doctype html", "<html"))
