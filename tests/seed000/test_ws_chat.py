"""``/ws/chat`` through the real ASGI application with channels' WebsocketCommunicator."""
from __future__ import annotations

from tests.conftest import merged_content_deltas

import logging

import pytest
from channels.testing import WebsocketCommunicator

from chat_app.models import Run
from orchestrator_site.asgi import application
from tests.conftest import wait_for
from tests.fakes.anthropic_server import stall, text_reply, tool_use_reply
from tools_app.models import ToolConfirmation

from .conftest import ANALYST

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://testserver")


def _communicator(token: str | None, *, origin: tuple[bytes, bytes] | None = ORIGIN) -> WebsocketCommunicator:
    path = f"/ws/chat?token={token}" if token else "/ws/chat"
    return WebsocketCommunicator(application, path, headers=[origin] if origin else [])


async def _connected(token: str) -> WebsocketCommunicator:
    comm = _communicator(token)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    return comm


async def _until_end(comm: WebsocketCommunicator, timeout: float = 10) -> list[dict]:
    events = []
    while True:
        event = await comm.receive_json_from(timeout=timeout)
        events.append(event)
        if event["type"] in ("done", "error"):
            return events


async def test_ws_chat_streams_a_turn_with_token_auth(claude, token):
    claude.script(text_reply(["Hi ", "there"]))
    comm = await _connected(token)
    await comm.send_json_to({"agent_role": ANALYST, "message": "hello", "conversation_history": [
        {"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"}]})
    events = merged_content_deltas(await _until_end(comm))
    assert events[0] == {"type": "content_delta", "content": "Hi there"}
    assert events[-1]["type"] == "done" and events[-1]["content"] == "Hi there"
    assert claude.last_request.json["messages"] == [
        {"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "hello"}]
    await comm.disconnect()


async def test_ws_chat_refuses_anonymous_and_bad_token(agents, token):
    comm = _communicator(None)
    connected, code = await comm.connect(timeout=5)
    assert not connected and code == 4401
    comm = _communicator("not-a-token")
    connected, code = await comm.connect(timeout=5)
    assert not connected and code == 4401


async def test_ws_chat_refuses_foreign_origin(token):
    comm = _communicator(token, origin=(b"origin", b"http://evil.example"))
    connected, _ = await comm.connect(timeout=5)
    assert not connected


async def test_ws_chat_accepts_non_browser_client_without_origin(token):
    comm = _communicator(token, origin=None)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.disconnect()


async def test_ws_chat_accepts_local_dev_origin_on_another_port(token):
    comm = _communicator(token, origin=(b"origin", b"http://localhost:3000"))
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.disconnect()


def test_ws_origin_validator_accepts_configured_cors_origin_exactly(settings):
    from urllib.parse import urlparse

    from orchestrator_site.ws_auth import WebSocketOriginValidator

    settings.CORS_ALLOWED_ORIGINS = ["https://app.example.com"]
    validator = WebSocketOriginValidator(None)
    assert validator.valid_origin(urlparse("https://app.example.com"))
    assert not validator.valid_origin(urlparse("https://app.example.com:8443"))
    assert not validator.valid_origin(urlparse("https://evil.example"))


async def test_ws_chat_session_cookie_auth(user, agents, client):
    from asgiref.sync import sync_to_async

    await sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    comm = WebsocketCommunicator(application, "/ws/chat", headers=[ORIGIN, (b"cookie", cookie)])
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.send_json_to({"agent_role": "coder", "message": "cookie works"})
    events = await _until_end(comm)
    assert events[-1]["content"] == "Mock reply from coder: cookie works"
    await comm.disconnect()


async def test_ws_chat_bad_input_gets_error_and_socket_stays_usable(token, agents, caplog):
    caplog.set_level(logging.INFO, logger="orchestrator.ws")
    comm = await _connected(token)

    await comm.send_to(text_data="{not json")
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["code"] == "malformed_json"

    await comm.send_json_to({"agent_role": "nobody", "message": "hi"})
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["code"] == "agent_not_found"
    assert "coder" in error["valid_roles"] and "Valid roles" in error["message"]

    await comm.send_json_to({"agent_role": "coder", "message": "hi", "conversation_history": [{"role": "bot"}]})
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["code"] == "invalid_input" and "conversation_history" in error["errors"]

    await comm.send_json_to(["not", "an", "object"])
    assert (await comm.receive_json_from(timeout=5))["code"] == "invalid_input"
    await comm.send_json_to({"type": "dance"})
    assert (await comm.receive_json_from(timeout=5))["code"] == "unknown_type"
    await comm.send_to(bytes_data=b"\x00\x01")
    assert (await comm.receive_json_from(timeout=5))["code"] == "malformed_json"

    await comm.send_json_to({"agent_role": "coder", "message": "still here"})
    events = await _until_end(comm)
    assert events[-1]["type"] == "done" and events[-1]["content"] == "Mock reply from coder: still here"
    assert any("malformed JSON" in r.getMessage() for r in caplog.records)
    assert any("turn refused" in r.getMessage() for r in caplog.records)
    await comm.disconnect()


async def test_ws_chat_several_messages_run_in_order(token, agents):
    comm = await _connected(token)
    await comm.send_json_to({"agent_role": "coder", "message": "first"})
    await comm.send_json_to({"agent_role": "researcher", "message": "second"})
    first = await _until_end(comm)
    second = await _until_end(comm)
    assert first[-1]["content"] == "Mock reply from coder: first"
    assert second[-1]["content"] == "Mock reply from researcher: second"
    assert first[-1]["run_id"] != second[-1]["run_id"]
    await comm.disconnect()


async def test_ws_chat_run_error_is_an_error_event(token, agents):
    comm = await _connected(token)
    await comm.send_json_to({"agent_role": "coder", "message": "/fail nope"})
    events = await _until_end(comm)
    assert events[-1]["type"] == "error" and "nope" in events[-1]["message"]
    await comm.send_json_to({"agent_role": "coder", "message": "again"})
    assert (await _until_end(comm))[-1]["type"] == "done"
    await comm.disconnect()


@pytest.mark.parametrize("approved", [True, False])
async def test_ws_chat_confirm_message_decides_waiting_tool(claude, token, analyst_workspace, approved):
    claude.script(tool_use_reply("write_file", {"path": "out.txt", "content": "hello"}, id="t_w"), text_reply("Fin."))
    comm = await _connected(token)
    await comm.send_json_to({"agent_role": ANALYST, "message": "write it"})
    pending = await comm.receive_json_from(timeout=10)
    assert pending == {"type": "tool_use", "id": "t_w", "name": "write_file", "input": {"path": "out.txt", "content": "hello"}}
    waiting = await comm.receive_json_from(timeout=10)
    assert waiting["status"] == "awaiting_input" and waiting["id"] == "t_w"
    assert await comm.receive_nothing(timeout=0.3)  # the run waits for the person
    assert not (analyst_workspace / "out.txt").exists()

    await comm.send_json_to({"type": "confirm", "confirmation_id": waiting["confirmation_id"], "approved": approved})
    events = await _until_end(comm)
    result = events[0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t_w"
    assert result["is_error"] is (not approved)
    assert (analyst_workspace / "out.txt").exists() is approved
    assert events[-1]["type"] == "done"

    # The first decision won: deciding again is a 409-style error event, the socket stays usable.
    await comm.send_json_to({"type": "confirm", "confirmation_id": waiting["confirmation_id"], "approved": True})
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["code"] == "confirmation_already_decided"
    await comm.disconnect()


async def test_ws_chat_confirm_errors(token, other_user, agents):
    comm = await _connected(token)
    await comm.send_json_to({"type": "confirm", "confirmation_id": "8a0d3f0e-1d0c-4bd1-9d61-6d4c1f2b7a11", "approved": True})
    error = await comm.receive_json_from(timeout=5)
    assert error["code"] == "confirmation_not_found"
    await comm.send_json_to({"type": "confirm", "confirmation_id": "x", "approved": "yes"})
    assert (await comm.receive_json_from(timeout=5))["code"] == "invalid_input"
    await comm.disconnect()


async def test_ws_chat_cannot_decide_another_users_confirmation(claude, token, other_user, analyst_workspace):
    from rest_framework.authtoken.models import Token
    from asgiref.sync import sync_to_async

    other_token = (await sync_to_async(Token.objects.get_or_create)(user=other_user))[0].key
    claude.script(tool_use_reply("write_file", {"path": "x.txt", "content": "x"}), text_reply("ok"))
    owner = await _connected(token)
    await owner.send_json_to({"agent_role": ANALYST, "message": "write"})
    await owner.receive_json_from(timeout=10)
    waiting = await owner.receive_json_from(timeout=10)
    intruder = await _connected(other_token)
    await intruder.send_json_to({"type": "confirm", "confirmation_id": waiting["confirmation_id"], "approved": True})
    assert (await intruder.receive_json_from(timeout=5))["code"] == "confirmation_not_found"
    confirmation = await ToolConfirmation.objects.aget(id=waiting["confirmation_id"])
    assert confirmation.status == "pending"
    await owner.send_json_to({"type": "confirm", "confirmation_id": waiting["confirmation_id"], "approved": False})
    assert (await _until_end(owner))[-1]["type"] == "done"
    await owner.disconnect()
    await intruder.disconnect()


async def test_ws_chat_disconnect_leaves_the_run_going(claude, token):
    reply = stall(text_reply(["Hel", "lo"]))
    claude.script(reply)
    comm = await _connected(token)
    await comm.send_json_to({"agent_role": ANALYST, "message": "hi"})
    assert (await comm.receive_json_from(timeout=10)) == {"type": "content_delta", "content": "Hel"}
    await comm.disconnect()
    reply.release.set()

    async def finished():
        return await Run.objects.filter(status="succeeded").aexists()

    await wait_for(finished, timeout=10)
    run = await Run.objects.aget(status="succeeded")
    assert run.usage["output_tokens"] == 2
