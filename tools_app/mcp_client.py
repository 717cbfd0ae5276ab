"""MCP servers as tools: connect with the ``mcp`` SDK, list their tools, call them for an engine.

Which servers a run gets is decided once, when the run is created, by
:func:`tools_app.mcp_policy.mcp_servers_for_run` (admin-registered ``McpServer`` rows; a request
only names them). The run service opens that list (``options["mcp_servers"]``) with
:class:`McpToolset` for the length of the run and hands the tools to the
:class:`~tools_app.runner.ToolRunner` as ``extra_tools``, so every engine offers them to its model
like the built-in tools, and the same approval flow applies. This module trusts the list it is
given about *what* to start; it still re-checks HTTP addresses when it connects (below).

Server config (a list of these; unknown keys are rejected so typos do not pass silently)::

    {"name": "calc", "command": ["python", "-m", "calc_server"], "env": {"K": "v"}, "cwd": "/srv"}
    {"name": "calc", "command": "python", "args": ["-m", "calc_server"]}   # Claude-SDK style
    {"name": "docs", "url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer x"}}

- ``name``: letters, digits, ``_`` and ``-``; unique in the list.
- stdio: ``command`` (argv list, or a program with ``args``), optional ``env`` (merged over the
  SDK's minimal safe environment: PATH, HOME, USER …; API keys are not inherited) and ``cwd``.
- streamable HTTP: ``url`` (http/https), optional ``headers``.
- optional ``type``: ``"stdio"`` or ``"http"``; must agree with ``command``/``url`` when given.
- optional ``timeout``: seconds for each tool call (default ``TOOL_TIMEOUT``).
- optional ``trusted`` (HTTP only, default false): skip the address check below. Set only from
  an admin's ``McpServer`` row, never from a request.
- optional ``requires_approval``: ``true`` (the default: an MCP server's tools can do anything,
  so a person approves each call), ``false`` (none of this server's tools need approval), or a
  list of the server's tool names that need approval (the others do not). This is the tools'
  default; approval rules (``tools_app/policy.py``) on the full tool name (``mcp__calc__add``)
  or a glob (``mcp__calc__*``) still win.

Tool names: the model sees ``mcp__<server>__<tool>``, lower-cased with every character outside
``[a-z0-9_]`` replaced by ``_`` and cut to 64 characters (with a short hash when cut or when two
tools would collide), so they pass the registry's name rule ``^[a-z][a-z0-9_]{0,63}$``.

Addresses: an HTTP server that is not ``trusted`` must pass the ``web_fetch`` tool's address
rule (every address its host resolves to is public; ``WEB_FETCH_ALLOW_PRIVATE`` lifts that, the
cloud metadata address is refused even then). :func:`mcp_url_refusal` checks it when the run is
created; connecting checks it again, and every connection the HTTP client opens goes to an
address checked just before (pinned, so a DNS answer that changes in between cannot redirect it).

Connecting (and listing tools) is bounded by ``MCP_CONNECT_TIMEOUT``; a server that cannot be
started or reached ends the run with :class:`~agents_app.engines.base.EngineError` (code
``mcp_connect_failed``) naming the server. A config that does not have this shape raises
:class:`McpConfigError` (a ``ValueError``) before anything starts; inside a run it becomes an
``EngineError`` with code ``invalid_mcp_config``.
"""
from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import re
import socket
from contextlib import AsyncExitStack
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import httpcore2

from agents_app.engines.base import EngineError

from . import conf
from .registry import Tool, ToolContext, ToolResult
from .sandbox import truncate_text

logger = logging.getLogger("orchestrator.tools.mcp")

SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_TOOL_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_ALLOWED_KEYS = {"name", "type", "command", "args", "env", "cwd", "url", "headers", "timeout", "requires_approval",
                 "trusted"}
_MAX_TOOL_PAGES = 100


class McpConfigError(ValueError):
    """An MCP server config that does not have the documented shape; the message says what."""


# --- config --------------------------------------------------------------------------------------

def validate_mcp_servers(value: Any) -> list[dict[str, Any]]:
    """Check a list of MCP server configs and return it normalised (argv in ``command``).

    Raises:
        McpConfigError: the first problem found, naming the entry.
    """
    if value in (None, ""):
        return []
    if not isinstance(value, list):
        raise McpConfigError("MCP servers must be a list of server objects.")
    seen: set[str] = set()
    out = []
    for index, entry in enumerate(value):
        server = _validate_server(entry, index)
        if server["name"] in seen:
            raise McpConfigError(f"MCP server name {server['name']!r} is used twice.")
        seen.add(server["name"])
        out.append(server)
    return out


def _validate_server(entry: Any, index: int) -> dict[str, Any]:
    where = f"MCP server #{index + 1}"
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where} must be an object with a name and a command or url.")
    name = entry.get("name")
    if not isinstance(name, str) or not SERVER_NAME_RE.fullmatch(name):
        raise McpConfigError(f"{where}: 'name' must be 1-64 letters, digits, '_' or '-' (got {name!r}).")
    where = f"MCP server {name!r}"
    unknown = sorted(set(entry) - _ALLOWED_KEYS)
    if unknown:
        raise McpConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_ALLOWED_KEYS))}.")
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        raise McpConfigError(f"{where}: give exactly one of 'command' (stdio) or 'url' (streamable HTTP).")
    kind = entry.get("type")
    if kind is not None and kind not in ("stdio", "http"):
        raise McpConfigError(f"{where}: 'type' must be 'stdio' or 'http'.")
    server: dict[str, Any] = {"name": name}
    if has_command:
        if kind == "http":
            raise McpConfigError(f"{where}: type 'http' needs a 'url', not a 'command'.")
        command, args = entry["command"], entry.get("args", [])
        if not _is_str_list(args):
            raise McpConfigError(f"{where}: 'args' must be a list of strings.")
        if isinstance(command, str):
            argv = [command, *args]
        elif _is_str_list(command):
            argv = [*command, *args]
        else:
            raise McpConfigError(f"{where}: 'command' must be a list of strings (argv) or a program name.")
        if not argv or not argv[0].strip():
            raise McpConfigError(f"{where}: 'command' must not be empty.")
        server["command"] = argv
        env = entry.get("env", {})
        if not _is_str_dict(env):
            raise McpConfigError(f"{where}: 'env' must map names to string values.")
        server["env"] = dict(env)
        if entry.get("cwd") is not None:
            if not isinstance(entry["cwd"], str):
                raise McpConfigError(f"{where}: 'cwd' must be a string path.")
            server["cwd"] = entry["cwd"]
        for key in ("url", "headers", "trusted"):
            if key in entry:
                raise McpConfigError(f"{where}: {key!r} is for HTTP servers, not stdio ones.")
    else:
        if kind == "stdio":
            raise McpConfigError(f"{where}: type 'stdio' needs a 'command', not a 'url'.")
        url = entry["url"]
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise McpConfigError(f"{where}: 'url' must be an http:// or https:// URL.")
        server["url"] = url
        headers = entry.get("headers", {})
        if not _is_str_dict(headers):
            raise McpConfigError(f"{where}: 'headers' must map header names to string values.")
        server["headers"] = dict(headers)
        trusted = entry.get("trusted", False)
        if not isinstance(trusted, bool):
            raise McpConfigError(f"{where}: 'trusted' must be true or false.")
        server["trusted"] = trusted
        for key in ("args", "env", "cwd"):
            if key in entry:
                raise McpConfigError(f"{where}: {key!r} is for stdio servers, not HTTP ones.")
    timeout = entry.get("timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise McpConfigError(f"{where}: 'timeout' must be a positive number of seconds.")
        server["timeout"] = float(timeout)
    approval = entry.get("requires_approval", True)
    if not isinstance(approval, bool) and not _is_str_list(approval):
        raise McpConfigError(f"{where}: 'requires_approval' must be true, false or a list of tool names.")
    server["requires_approval"] = approval if isinstance(approval, bool) else list(approval)
    return server


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def mcp_tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>`` under the registry's name rule (see the module docstring)."""
    name = re.sub(r"[^a-z0-9_]", "_", f"mcp__{server}__{tool}".lower())
    if len(name) > 64:
        name = f"{name[:57]}_{hashlib.sha1(f'{server}/{tool}'.encode()).hexdigest()[:6]}"
    return name


def describe_server(server: dict[str, Any]) -> str:
    """A short, secret-free description for error messages (no env or header values)."""
    if "url" in server:
        return f"{server['name']} (http {server['url']})"
    return f"{server['name']} (stdio {' '.join(server['command'])[:200]})"


# --- addresses -----------------------------------------------------------------------------------

class McpAddressRefused(ConnectionRefusedError):
    """An HTTP MCP server's host is (or resolves to) an address the address rule refuses."""


def _allow_private() -> bool:
    return bool(conf.setting("WEB_FETCH_ALLOW_PRIVATE", False))


def checked_address(host: str, port: int, *, allow_private: bool) -> str:
    """Resolve ``host`` and return the address to connect to, if *every* address it has is allowed.

    Raises:
        McpAddressRefused: one of the addresses is refused (the message says which and why).
        OSError: the host does not resolve.
    """
    from .tools.web_fetch import forbidden_reason

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    if not addresses:
        raise socket.gaierror(f"could not resolve host {host!r}")
    for address in addresses:
        reason = forbidden_reason(address, allow_private=allow_private)
        if reason:
            raise McpAddressRefused(f"{host} resolves to {address}, {reason}")
    return str(addresses[0])


def mcp_url_refusal(url: str) -> str | None:
    """Why the address rule refuses an HTTP MCP server's ``url`` (``None``: allowed, or not
    resolvable now, which connecting will report). Resolves the host: call it off the event loop."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"invalid port in {url!r}"
    if not parts.hostname:
        return f"no host in {url!r}"
    try:
        checked_address(parts.hostname, port, allow_private=_allow_private())
    except McpAddressRefused as exc:
        return str(exc)
    except (OSError, UnicodeError, ValueError):
        return None
    return None


def _checked_http_client(headers: dict[str, str] | None) -> Any:
    """An ``httpx2`` client (the SDK's default timeouts) whose every TCP connection goes to an
    address checked just before it, so DNS cannot point it elsewhere after the check; proxies from
    the environment are ignored, as ``web_fetch`` does (a proxy would make the check meaningless)."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    pool = transport._pool  # httpx2 takes no network backend; its httpcore2 pool does
    if not isinstance(pool, httpcore2.AsyncConnectionPool) or not hasattr(pool, "_network_backend"):
        raise RuntimeError("httpx2/httpcore2 changed: cannot pin MCP connections to checked addresses")
    pool._network_backend = _CheckedNetworkBackend(allow_private=_allow_private())
    return httpx2.AsyncClient(headers=headers, transport=transport, trust_env=False,
                              timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))


class _CheckedNetworkBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's anyio backend, connecting only to checked addresses (see ``checked_address``)."""

    def __init__(self, *, allow_private: bool) -> None:
        self._inner = httpcore2.AnyIOBackend()
        self._allow_private = allow_private

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> Any:
        try:
            address = await asyncio.to_thread(partial(checked_address, host, port, allow_private=self._allow_private))
        except McpAddressRefused as exc:
            raise httpcore2.ConnectError(f"refusing to connect: {exc}") from exc
        except (OSError, UnicodeError, ValueError) as exc:
            raise httpcore2.ConnectError(f"could not resolve host {host!r}: {exc}") from exc
        return await self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                             socket_options=socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise OSError("MCP servers over HTTP connect by TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


# --- tools ---------------------------------------------------------------------------------------

class McpTool(Tool):
    """One tool of a connected MCP server; an instance, never registered globally."""

    register = False

    def __init__(self, *, name: str, server: str, remote_name: str, description: str,
                 input_schema: dict[str, Any], requires_approval: bool, client: Any, timeout: float):
        self.name = name  # type: ignore[misc]  (per instance, unlike registered tools)
        self.server = server
        self.remote_name = remote_name
        self.description = description  # type: ignore[misc]
        self.input_schema = input_schema  # type: ignore[misc]
        self.requires_approval = requires_approval  # type: ignore[misc]
        self._client = client
        self._timeout = timeout

    def spec(self) -> dict[str, Any]:  # type: ignore[override]  (instance data, not class data)
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        meta = {"server": self.server, "tool": self.remote_name}
        try:
            async with asyncio.timeout(self._timeout):
                result = await self._client.call_tool(self.remote_name, input)
        except TimeoutError:
            return ToolResult(f"MCP tool {self.remote_name} on server {self.server} timed out after {self._timeout:g} s.",
                              is_error=True, metadata=meta)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the model reads what went wrong
            return ToolResult(f"MCP tool {self.remote_name} on server {self.server} failed: {_reason(exc)}",
                              is_error=True, metadata=meta)
        text = _result_text(result)
        text, truncated = truncate_text(text, int(conf.setting("TOOL_OUTPUT_LIMIT", 50_000)))
        return ToolResult(text, is_error=bool(result.is_error), metadata={**meta, "truncated": truncated})


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:  # image, audio: the model gets a marker, not base64
            parts.append(f"[{kind or 'content'} {getattr(block, 'mime_type', '') or ''}]".replace(" ]", "]"))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _reason(exc: BaseException) -> str:
    """The innermost readable causes of an error (anyio wraps transport errors in groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(_reason(e) for e in exc.exceptions))
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename:
        text = f"{exc.strerror or type(exc).__name__}: {exc.filename}"
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


# --- the toolset ---------------------------------------------------------------------------------

class McpToolset:
    """Connected MCP servers for one run: ``async with McpToolset(configs) as tools`` → {name: McpTool}.

    Every server is connected in the task that enters the toolset (the SDK's transports hold
    anyio task groups), so enter and exit it in the same task, as the run service does.
    """

    def __init__(self, servers: list[dict[str, Any]]):
        self._raw = servers
        self._stack: AsyncExitStack | None = None
        self.tools: dict[str, McpTool] = {}

    async def __aenter__(self) -> dict[str, McpTool]:
        try:
            servers = validate_mcp_servers(self._raw)
        except McpConfigError as exc:
            raise EngineError(f"Invalid MCP server configuration: {exc}", code="invalid_mcp_config") from exc
        stack = AsyncExitStack()
        try:
            for server in servers:
                await self._connect(stack, server)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return dict(self.tools)

    async def __aexit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        self.tools = {}
        if stack is not None:
            try:
                await stack.aclose()
            except Exception:  # noqa: BLE001 - closing must not replace the run's own outcome
                logger.warning("closing MCP servers failed", exc_info=True)

    async def _connect(self, stack: AsyncExitStack, server: dict[str, Any]) -> None:
        from mcp import Client

        timeout = float(conf.setting("MCP_CONNECT_TIMEOUT", 30.0))
        try:
            async with asyncio.timeout(timeout):
                client = await stack.enter_async_context(Client(await self._target(stack, server)))
                listed = await _list_tools(client)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any transport failure becomes one readable error
            reason = f"timed out after {timeout:g} s" if isinstance(exc, TimeoutError) else _reason(exc)
            logger.warning("MCP server %s could not be connected: %s", describe_server(server), reason)
            raise EngineError(f"MCP server {describe_server(server)} could not be connected: {reason}",
                              code="mcp_connect_failed") from exc
        call_timeout = float(server.get("timeout") or conf.setting("TOOL_TIMEOUT", 30.0))
        approval = server["requires_approval"]
        for tool in listed:
            name = mcp_tool_name(server["name"], tool.name)
            if not _TOOL_NAME_RE.match(name) or name in self.tools:
                name = mcp_tool_name(server["name"], f"{tool.name}_{hashlib.sha1(tool.name.encode()).hexdigest()[:6]}")
            needs = approval if isinstance(approval, bool) else tool.name in approval
            self.tools[name] = McpTool(
                name=name, server=server["name"], remote_name=tool.name,
                description=tool.description or tool.title or f"MCP tool {tool.name} on server {server['name']}.",
                input_schema=tool.input_schema or {"type": "object", "properties": {}},
                requires_approval=needs, client=client, timeout=call_timeout,
            )

    @staticmethod
    async def _target(stack: AsyncExitStack, server: dict[str, Any]) -> Any:
        if "url" in server:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client  # the SDK's own defaults (timeouts)

            headers = server["headers"] or None
            if server.get("trusted"):
                http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
            else:
                # Checked when the run was created; again now, since DNS may have changed since.
                refusal = await asyncio.to_thread(mcp_url_refusal, server["url"])
                if refusal:
                    raise McpAddressRefused(refusal)
                http = await stack.enter_async_context(_checked_http_client(headers))
            return streamable_http_client(server["url"], http_client=http)
        from mcp import StdioServerParameters

        argv = server["command"]
        return StdioServerParameters(command=argv[0], args=argv[1:], env=server["env"] or None, cwd=server.get("cwd"))


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(_MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools
