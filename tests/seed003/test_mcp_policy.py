"""A request may only name MCP servers an admin registered for the agent; inline specs (a command
to start, a URL to reach) need a permission. Over the seed-003 endpoint (the one that takes
``mcpServers``), the run service, and the toolset's own check when it connects. The policy's
details are unit-tested in ``tests/tools/test_mcp_policy.py``; the other entry points in
``test_mcp_entry_points.py``."""
from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission

from agents_app.engines import EngineError
from chat_app import services
from chat_app.models import Conversation, Run
from tests.fakes.anthropic_server import text_reply, tool_use_reply
from tools_app.mcp_client import McpToolset
from tools_app.mcp_policy import McpServerNotAllowed
from tools_app.registry import ToolContext

from .conftest import ANALYST, aregister_mcp_server, open_stream, stream_path

pytestmark = pytest.mark.django_db(transaction=True)


def marker_spec(marker: Path, **extra) -> dict:
    """An inline stdio spec whose command leaves a file behind if it is ever started."""
    return {"name": "x", "command": "sh", "args": ["-c", f"touch {shlex.quote(str(marker))}"], **extra}


@sync_to_async
def _grant_inline(user) -> None:
    user.user_permissions.add(Permission.objects.get(codename="use_inline_mcp_servers", content_type__app_label="tools_app"))


async def _post(user, token, body, agents) -> tuple[int, dict, Conversation]:
    conversation = await Conversation.objects.acreate(owner=user, title="t", agent=agents[ANALYST])
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body=body, accept="application/json")
    payload = await stream.json()
    await stream.close()
    return stream.status, payload, conversation


@dataclass
class Listener:
    """A TCP port on 127.0.0.1 that tells whether anything connected (it never answers)."""

    sock: socket.socket

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"

    def connected(self) -> bool:
        try:
            self.sock.accept()[0].close()
        except BlockingIOError:
            return False
        return True


@pytest.fixture
def listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield Listener(sock)


@pytest.mark.parametrize("shape", ["sdk_style", "argv"])
async def test_stream_inline_stdio_spec_from_ordinary_user_is_403_and_starts_nothing(user, token, agents, tmp_path, shape):
    marker = tmp_path / "pwned"
    spec = marker_spec(marker)
    if shape == "argv":
        spec = {"name": "x", "command": [spec["command"], *spec["args"]]}
    status, payload, conversation = await _post(user, token, {"content": "hi", "mcpServers": [spec]}, agents)
    assert status == 403 and payload["code"] == "mcp_server_not_allowed", payload
    assert "registered" in payload["message"]
    assert not marker.exists()
    # Refused before the run service recorded anything: no run, no message, nothing to start later.
    assert not await Run.objects.filter(conversation=conversation).aexists()
    assert not await conversation.messages.aexists()


async def test_stream_inline_http_spec_from_ordinary_user_is_403_and_connects_nowhere(user, token, agents, listener):
    body = {"content": "hi", "mcpServers": [{"name": "x", "url": listener.url, "headers": {"A": "b"}}]}
    status, payload, conversation = await _post(user, token, body, agents)
    assert status == 403 and payload["code"] == "mcp_server_not_allowed"
    assert not listener.connected()
    assert not await Run.objects.filter(conversation=conversation).aexists()


@pytest.mark.parametrize("case", ["unknown", "disabled", "not_for_this_agent"])
async def test_stream_server_the_agent_may_not_use_is_403(user, token, agents, tmp_path, case):
    marker = tmp_path / "started"
    if case == "disabled":
        await aregister_mcp_server(marker_spec(marker, name="calc"), always=False, enabled=False)
    elif case == "not_for_this_agent":
        await aregister_mcp_server(marker_spec(marker, name="calc"), agent_role="coder")
    status, payload, conversation = await _post(user, token, {"content": "hi", "mcpServers": ["calc"]}, agents)
    assert status == 403 and payload["code"] == "mcp_server_not_allowed"
    assert "'calc'" in payload["message"] and "touch" not in payload["message"]
    assert not marker.exists()
    assert not await Run.objects.filter(conversation=conversation).aexists()


async def test_stream_inline_spec_with_permission_runs_its_tools(user, token, claude, agents, mcp_stdio):
    await _grant_inline(user)
    claude.script(tool_use_reply("mcp__mine__add", {"a": 20, "b": 22}), text_reply("42"))
    conversation = await Conversation.objects.acreate(owner=user, title="t", agent=agents[ANALYST])
    body = {"content": "add", "mcpServers": [{**mcp_stdio, "name": "mine", "requires_approval": False}]}
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body=body)
    events = await stream.events(timeout=20)
    await stream.close()
    assert stream.status == 200
    assert [e.data["status"] for e in events if e.event == "tool_use"] == ["pending", "running", "succeeded"]
    assert events[-1].event == "done" and events[-1].data["text"] == "42"


async def test_run_inline_spec_with_permission_starts_the_process(user, agents, tmp_path):
    """The same marker spec that is refused above does start for a permission holder (so the 403
    is the permission, not a broken spec); it is no MCP server, so the run then fails to connect."""
    await _grant_inline(user)
    marker = tmp_path / "started"
    created = await services.run_start(user=user, input="hi", agent_role="coder",
                                       options={"mcp_servers": [marker_spec(marker)]})
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    assert next(e.payload for e in events if e.event == "error")["code"] == "mcp_connect_failed"
    assert marker.exists()


async def test_run_create_refuses_inline_spec_in_options_without_permission(user, agents, tmp_path):
    """The service decides, whatever the transport: an inline spec in ``options`` is refused too."""
    marker = tmp_path / "pwned"
    with pytest.raises(McpServerNotAllowed):
        await services.run_start(user=user, input="hi", agent_role="coder", options={"mcp_servers": [marker_spec(marker)]})
    assert not marker.exists()
    assert not await Conversation.objects.filter(owner=user).aexists()
    assert not await Run.objects.aexists()


async def test_stream_inline_url_to_loopback_is_403_even_with_permission(user, token, agents, listener, settings):
    settings.WEB_FETCH_ALLOW_PRIVATE = False
    await _grant_inline(user)
    body = {"content": "hi", "mcpServers": [{"name": "x", "url": listener.url}]}
    status, payload, conversation = await _post(user, token, body, agents)
    assert status == 403 and payload["code"] == "mcp_server_not_allowed"
    assert "loopback" in payload["message"]
    assert not listener.connected()
    assert not await Run.objects.filter(conversation=conversation).aexists()


async def test_stream_untrusted_registered_server_on_loopback_is_403(user, token, agents, mcp_http, settings):
    settings.WEB_FETCH_ALLOW_PRIVATE = False
    await aregister_mcp_server({"name": "calc", "url": mcp_http.url}, always=False)
    status, payload, _ = await _post(user, token, {"content": "hi", "mcpServers": ["calc"]}, agents)
    assert status == 403 and payload["code"] == "mcp_server_not_allowed"
    assert "trusted" in payload["message"] and "127.0.0.1" not in payload["message"]


# --- the check when connecting -------------------------------------------------------------------

async def test_mcp_toolset_refuses_untrusted_loopback_url_when_connecting(mcp_http, settings):
    settings.WEB_FETCH_ALLOW_PRIVATE = False
    with pytest.raises(EngineError) as info:
        async with McpToolset([{"name": "calc", "url": mcp_http.url}]):
            pass
    assert info.value.code == "mcp_connect_failed" and "loopback" in info.value.message


async def test_mcp_toolset_untrusted_url_connects_to_the_checked_address(mcp_http, settings):
    """With private addresses allowed (development), an untrusted server goes through the
    checking client, which then connects to the address it checked."""
    settings.WEB_FETCH_ALLOW_PRIVATE = True
    async with McpToolset([{"name": "calc", "url": mcp_http.url}]) as tools:
        result = await tools["mcp__calc__add"].run(input={"a": 1, "b": 2}, context=ToolContext(workspace=Path(".")))
    assert result.output == "3"


async def test_mcp_toolset_refuses_an_address_that_changed_after_the_check(mcp_http, settings, monkeypatch):
    """DNS rebinding: the name passes the first look-up (public), then points at loopback."""
    settings.WEB_FETCH_ALLOW_PRIVATE = False
    real = socket.getaddrinfo
    answers = iter(["93.184.216.34"])

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "rebind.test":
            return real(next(answers, "127.0.0.1"), port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    port = mcp_http.url.rsplit(":", 1)[1].split("/")[0]
    with pytest.raises(EngineError) as info:
        async with McpToolset([{"name": "calc", "url": f"http://rebind.test:{port}/mcp"}]):
            pass
    assert info.value.code == "mcp_connect_failed"
    assert "refusing to connect: rebind.test resolves to 127.0.0.1, a loopback address" in info.value.message
