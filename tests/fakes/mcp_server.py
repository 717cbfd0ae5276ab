"""A small real MCP server for tests, built with the ``mcp`` SDK's own ``MCPServer`` class.

Tools: ``add(a, b)`` → the sum as text, ``echo(text)`` → the text, ``env(name)`` → the value of an
environment variable (shows a config's ``env`` reached the process), ``header(name)`` → a request
header (shows a config's ``headers`` reached the HTTP server), ``fail()`` → raises, so the call
comes back with ``isError``.

Over stdio (what an agent's ``{"command": [...]}`` config starts)::

    python -m tests.fakes.mcp_server            # or: python tests/fakes/mcp_server.py

Over streamable HTTP on 127.0.0.1, in a background thread of the test process::

    with McpHttpServer() as server:
        config = {"name": "calc", "url": server.url}

or as a process: ``python -m tests.fakes.mcp_server --http --port 8765`` (endpoint ``/mcp``).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script path: make ``tests`` importable for -m parity
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcp.server.mcpserver import Context, MCPServer  # noqa: E402

STDIO_COMMAND = [sys.executable, "-m", "tests.fakes.mcp_server"]
REPO_ROOT = Path(__file__).resolve().parents[2]


def build_server(name: str = "calc") -> MCPServer:
    server = MCPServer(name)

    @server.tool(description="Add two integers and return the sum.")
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Echo the given text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="Read an environment variable of the server process.")
    def env(name: str) -> str:
        return os.environ.get(name, "")

    @server.tool(description="Read a header of the current HTTP request (empty over stdio).")
    def header(name: str, ctx: Context) -> str:
        headers = ctx.headers
        return (headers.get(name) if headers is not None else None) or ""

    @server.tool(description="Always fails.")
    def fail() -> str:
        raise RuntimeError("the fail tool always fails")

    return server


def stdio_config(name: str = "calc", **extra: Any) -> dict[str, Any]:
    """An McpToolset config that starts this server over stdio (cwd-independent)."""
    env = {"PYTHONPATH": str(REPO_ROOT), **extra.pop("env", {})}
    return {"name": name, "command": list(STDIO_COMMAND), "env": env, **extra}


class McpHttpServer:
    """This server over streamable HTTP (uvicorn) on a free 127.0.0.1 port, in a daemon thread."""

    def __init__(self, name: str = "calc") -> None:
        self.name = name
        self._sock: socket.socket | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    @property
    def url(self) -> str:
        assert self._sock is not None, "server not started"
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/mcp"

    def start(self) -> "McpHttpServer":
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        app = build_server(self.name).streamable_http_app()
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name=f"mcp-http-{self.name}", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("MCP HTTP server did not start")
        return self

    def _serve(self) -> None:
        async def main() -> None:
            task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
            while not self._server.started and not task.done():
                await asyncio.sleep(0.01)
            self._started.set()
            await task

        asyncio.run(main())

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> "McpHttpServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--name", default="calc")
    args = parser.parse_args(argv)
    server = build_server(args.name)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
