"""web_fetch: scheme and address checks on every hop, pinned connections, size cap, HTML to text."""
from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from tools_app.registry import ToolContext, ToolError
from tools_app.tools import web_fetch
from tools_app.tools.web_fetch import WebFetchTool, check_url, forbidden_reason, html_to_text


async def _fetch(url: str, context: ToolContext):
    return await WebFetchTool().run(input={"url": url}, context=context)


def _fake_dns(monkeypatch: pytest.MonkeyPatch, table: dict[str, list[str]]) -> list[str]:
    """Answer ``table`` hosts from memory (recording each lookup); IP literals resolve as usual."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any):
        if host in table:
            lookups.append(host)
            return [
                (socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port or 0))
                for ip in table[host]
            ]
        ipaddress.ip_address(host)  # anything else must be an IP literal: no real DNS in tests
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost:8000/admin",
        "http://10.0.0.5/",
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0.0.0.0/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
    ],
)
def test_check_url_refuses_internal_addresses(url: str) -> None:
    with pytest.raises(ToolError, match="refusing to fetch"):
        check_url(url, allow_private=False)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://example.com/", "/relative", "javascript:alert(1)"])
def test_check_url_refuses_other_schemes(url: str) -> None:
    with pytest.raises(ToolError, match="only http and https"):
        check_url(url, allow_private=False)


def test_check_url_refuses_when_any_resolved_address_is_private(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, {"mixed.example": ["93.184.216.34", "10.1.2.3"]})
    with pytest.raises(ToolError, match="10.1.2.3"):
        check_url("https://mixed.example/", allow_private=False)


def test_check_url_returns_checked_public_address(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, {"public.example": ["93.184.216.34"]})
    assert check_url("https://public.example/page", allow_private=False) == "93.184.216.34"


def test_check_url_allow_private_still_refuses_metadata() -> None:
    assert check_url("http://127.0.0.1:9/", allow_private=True) == "127.0.0.1"
    with pytest.raises(ToolError, match="metadata"):
        check_url("http://169.254.169.254/latest/meta-data/", allow_private=True)


def test_forbidden_reason_classifies_addresses() -> None:
    assert forbidden_reason(ipaddress.ip_address("8.8.8.8"), allow_private=False) is None
    assert forbidden_reason(ipaddress.ip_address("127.0.0.2"), allow_private=False) == "a loopback address"
    assert forbidden_reason(ipaddress.ip_address("fe80::1"), allow_private=False) == "a link-local address"
    assert forbidden_reason(ipaddress.ip_address("::ffff:10.0.0.1"), allow_private=False) == "a private address"


@pytest.mark.asyncio
async def test_web_fetch_refuses_loopback_by_default(web_server, context: ToolContext) -> None:
    web_server.route("/", body="hello")
    result = await _fetch(web_server.url + "/", context)
    assert result.is_error
    assert "loopback" in result.output
    assert web_server.requests == []


@pytest.mark.asyncio
async def test_web_fetch_refuses_file_url(context: ToolContext) -> None:
    result = await _fetch("file:///etc/passwd", context)
    assert result.is_error and "only http and https" in result.output
    assert "root:" not in result.output


@pytest.mark.asyncio
async def test_web_fetch_returns_html_as_text(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    page = (
        "<!doctype html><html><head><title>Greeting</title><style>p{color:red}</style></head>"
        "<body><p>Hello <b>world</b> &amp; friends</p><script>steal()</script><ul><li>one</li><li>two</li></ul></body></html>"
    )
    web_server.route("/page", body=page, headers={"Content-Type": "text/html; charset=utf-8"})
    result = await _fetch(web_server.url + "/page", context)
    assert not result.is_error, result.output
    assert f"URL: {web_server.url}/page" in result.output
    assert "Status: 200" in result.output
    assert "Hello world & friends" in result.output
    assert "one\ntwo" in result.output
    assert "steal" not in result.output and "color:red" not in result.output and "<p>" not in result.output


@pytest.mark.asyncio
async def test_web_fetch_decodes_declared_charset(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    web_server.route("/latin", body="café".encode("latin-1"), headers={"Content-Type": "text/plain; charset=iso-8859-1"})
    result = await _fetch(web_server.url + "/latin", context)
    assert result.output.endswith("\n\ncafé")


@pytest.mark.asyncio
async def test_web_fetch_caps_response_size(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings.update(WEB_FETCH_ALLOW_PRIVATE=True, WEB_FETCH_MAX_BYTES=1000)
    web_server.route("/big", body="a" * 200_000, headers={"Content-Type": "text/plain"})
    result = await _fetch(web_server.url + "/big", context)
    assert not result.is_error
    assert "[response truncated: only the first 1000 bytes were read]" in result.output
    assert result.output.split("\n\n", 1)[1] == "a" * 1000
    assert result.metadata["truncated"] is True


@pytest.mark.asyncio
async def test_web_fetch_follows_redirects(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    web_server.route("/old", status=301, headers={"Location": "/new"})
    web_server.route("/new", body="moved here", headers={"Content-Type": "text/plain"})
    result = await _fetch(web_server.url + "/old", context)
    assert not result.is_error
    assert f"URL: {web_server.url}/new" in result.output
    assert result.output.endswith("moved here")


@pytest.mark.asyncio
async def test_web_fetch_redirect_to_metadata_refused(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    web_server.route("/hop", status=302, headers={"Location": "http://169.254.169.254/latest/meta-data/"})
    result = await _fetch(web_server.url + "/hop", context)
    assert result.is_error
    assert "169.254.169.254" in result.output and "metadata" in result.output


@pytest.mark.asyncio
async def test_web_fetch_redirect_to_loopback_refused(
    web_server, context: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Private addresses are refused (the default). Treat only the test server's own address as
    # public, so the first hop is fetched and the redirect's target meets the real check.
    real = web_fetch.forbidden_reason
    monkeypatch.setattr(
        web_fetch,
        "forbidden_reason",
        lambda address, *, allow_private: None if str(address) == "127.0.0.1" else real(address, allow_private=allow_private),
    )
    web_server.route("/hop", status=307, headers={"Location": f"http://127.0.0.2:{web_server.port}/secret"})
    result = await _fetch(web_server.url + "/hop", context)
    assert result.is_error
    assert "127.0.0.2" in result.output and "loopback" in result.output
    assert web_server.paths() == ["/hop"]


@pytest.mark.asyncio
async def test_web_fetch_too_many_redirects(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    web_server.route("/loop", status=302, headers={"Location": "/loop"})
    result = await _fetch(web_server.url + "/loop", context)
    assert result.is_error
    assert "too many redirects" in result.output
    assert len(web_server.requests) == web_fetch.MAX_REDIRECTS + 1


@pytest.mark.asyncio
async def test_web_fetch_connects_to_the_checked_address(
    web_server, context: ToolContext, tool_settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # DNS rebinding: the name must be resolved once, for the check, and the connection must go
    # to that address. A second lookup of the name would fail here.
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    lookups = _fake_dns(monkeypatch, {"pinned.test": ["127.0.0.1"]})
    web_server.route("/plain", body="pinned ok", headers={"Content-Type": "text/plain"})
    result = await _fetch(f"http://pinned.test:{web_server.port}/plain", context)
    assert not result.is_error, result.output
    assert result.output.endswith("pinned ok")
    assert lookups == ["pinned.test"]
    assert web_server.requests[0][1]["host"] == f"pinned.test:{web_server.port}"


@pytest.mark.asyncio
async def test_web_fetch_http_error_status_is_error(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    result = await _fetch(web_server.url + "/missing", context)
    assert result.is_error
    assert "Status: 404" in result.output and "not found" in result.output


@pytest.mark.asyncio
async def test_web_fetch_describes_binary_content(web_server, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    web_server.route("/img", body=b"\x89PNG\r\n\x1a\n" + bytes(100), headers={"Content-Type": "image/png"})
    result = await _fetch(web_server.url + "/img", context)
    assert not result.is_error
    assert "[binary content (image/png, 108 bytes) not shown]" in result.output


@pytest.mark.asyncio
async def test_web_fetch_unreachable_host_is_error(context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = await _fetch(f"http://127.0.0.1:{port}/", context)
    assert result.is_error
    assert "could not fetch" in result.output


def test_html_to_text_collapses_whitespace() -> None:
    assert html_to_text("<div>  a  \n\n  b </div><p>c</p>") == "a\nb\nc"
