"""The Claude engine through the real anthropic SDK against the scripted server, seen over SSE."""
from __future__ import annotations

from tests.conftest import merged_content_deltas

import asyncio
import json
import socket

import pytest
from asgiref.sync import sync_to_async

from agents_app.models import Agent
from chat_app.models import Message, Run
from tests.conftest import wait_for
from tests.fakes.anthropic_server import (
    http_error,
    max_tokens_reply,
    message_reply,
    mid_stream_error,
    raw_stream,
    stall,
    text_block,
    text_reply,
    tool_use_block,
    tool_use_reply,
)
from tools_app.models import ToolConfirmation, ToolRule
from tools_app.services import tool_confirmation_decide

from .conftest import ANALYST, MODEL, post_stream, types

pytestmark = pytest.mark.django_db(transaction=True)


def _messages(request) -> list[dict]:
    return request.json["messages"]


# --- plain answers ----------------------------------------------------------------------------

async def test_claude_engine_streams_plain_answer(claude, token, settings):
    claude.script(text_reply(["Hel", "lo", " world"], usage={"input_tokens": 12, "output_tokens": 3}))
    response, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})

    assert response.status_code == 200
    events = merged_content_deltas(events)
    assert events[0] == {"type": "content_delta", "content": "Hello world"}
    done = events[-1]
    assert types(events) == ["content_delta", "done"]
    assert done["content"] == "Hello world"
    assert done["usage"] == {"input_tokens": 12, "output_tokens": 3}
    assert done["run_id"] == response["X-Run-Id"] and done["conversation_id"] == response["X-Conversation-Id"]

    (request,) = claude.requests
    body = request.json
    assert body["model"] == MODEL and body["stream"] is True
    assert body["max_tokens"] == settings.ANTHROPIC_MAX_TOKENS
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert sorted(t["name"] for t in body["tools"]) == ["bash", "read_file", "web_fetch", "write_file"]
    assert request.api_key == "test-key"

    run = await Run.objects.aget(id=done["run_id"])
    assert run.engine == "claude" and run.status == "succeeded"
    assert run.usage == {"input_tokens": 12, "output_tokens": 3}
    saved = await Message.objects.aget(id=done["message_id"])
    assert saved.content == "Hello world" and saved.metadata["sessionId"].startswith("claude-")


async def test_claude_engine_max_tokens_ends_the_answer(claude, token):
    claude.script(max_tokens_reply(["cut ", "off"]))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "long please"})
    assert events[-1]["type"] == "done" and events[-1]["content"] == "cut off"
    assert len(claude.requests) == 1


async def test_claude_engine_uses_the_agents_model_override(claude, token, agents):
    await Agent.objects.filter(role=ANALYST).aupdate(model="gateway/custom-model-x")
    claude.script(text_reply("ok"))
    await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    assert claude.last_request.json["model"] == "gateway/custom-model-x"


async def test_claude_engine_bearer_token_reaches_gateway(claude, token, settings):
    settings.ANTHROPIC_AUTH_IS_BEARER = True
    claude.script(text_reply("ok"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    assert events[-1]["type"] == "done"
    assert claude.last_request.header("authorization") == "Bearer test-key"


# --- history and system prompt ------------------------------------------------------------------

async def test_claude_engine_sends_history_in_order_and_system_prompt(claude, token, analyst_workspace):
    (analyst_workspace / "CLAUDE.md").write_text("Always cite the CSV file names.", encoding="utf-8")
    claude.script(text_reply("Third answer"))
    history = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "second answer"},
    ]
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "third question",
                                          "conversation_history": history})
    assert events[-1]["type"] == "done"
    body = claude.last_request.json
    assert body["messages"] == history + [{"role": "user", "content": "third question"}]
    assert "R&D efficiency analyst" in body["system"]
    assert "Always cite the CSV file names." in body["system"]
    assert body["system"].index("R&D efficiency analyst") < body["system"].index("Always cite")


# --- the tool loop ----------------------------------------------------------------------------------

async def test_claude_engine_tool_loop_read_file_then_answer(claude, token, analyst_workspace):
    (analyst_workspace / "metrics.csv").write_text("week,lead_time\n1,3.5\n2,2.0\n", encoding="utf-8")
    claude.script(
        tool_use_reply("read_file", {"path": "metrics.csv"}, id="toolu_read1", text_before=["Let me ", "look."],
                       json_chunks=6, usage={"input_tokens": 20, "output_tokens": 9}),
        text_reply(["Lead time ", "fell to 2.0."], usage={"input_tokens": 40, "output_tokens": 5}),
    )
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "How is lead time?"})

    events = merged_content_deltas(events)
    assert types(events) == ["content_delta", "tool_use", "tool_result", "content_delta", "done"]
    assert events[1] == {"type": "tool_use", "id": "toolu_read1", "name": "read_file", "input": {"path": "metrics.csv"}}
    assert events[2] == {"type": "tool_result", "tool_use_id": "toolu_read1", "name": "read_file",
                         "output": "week,lead_time\n1,3.5\n2,2.0\n", "is_error": False, "status": "succeeded"}
    done = events[-1]
    assert done["content"] == "Let me look.\n\nLead time fell to 2.0."
    assert "".join(e["content"] for e in events if e["type"] == "content_delta") == done["content"]
    assert done["usage"] == {"input_tokens": 60, "output_tokens": 14}

    first, second = claude.requests
    assert _messages(second)[:1] == _messages(first)
    assert _messages(second)[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_read1", "name": "read_file", "input": {"path": "metrics.csv"}},
    ]}
    assert _messages(second)[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_read1", "content": "week,lead_time\n1,3.5\n2,2.0\n",
         "is_error": False},
    ]}


async def test_claude_engine_runs_several_tool_uses_of_one_turn_in_order(claude, token, analyst_workspace):
    (analyst_workspace / "a.txt").write_text("AAA")
    (analyst_workspace / "b.txt").write_text("BBB")
    claude.script(
        message_reply(tool_use_block("read_file", {"path": "a.txt"}, id="t_a"),
                      tool_use_block("read_file", {"path": "b.txt"}, id="t_b", json_chunks=1)),
        text_reply("Both read."),
    )
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "read both"})
    tool_events = [(e["type"], e.get("id") or e.get("tool_use_id")) for e in events if e["type"].startswith("tool")]
    assert tool_events == [("tool_use", "t_a"), ("tool_result", "t_a"), ("tool_use", "t_b"), ("tool_result", "t_b")]
    results = _messages(claude.requests[1])[-1]["content"]
    assert [(r["tool_use_id"], r["content"]) for r in results] == [("t_a", "AAA"), ("t_b", "BBB")]


async def test_claude_engine_refuses_tools_the_agent_is_not_allowed(claude, token, analyst_workspace):
    claude.script(tool_use_reply("run_python", {"code": "print(1)"}, id="t_py"), text_reply("ok"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "run python"})
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] is True and "not available to this agent" in result["output"]
    assert _messages(claude.requests[1])[-1]["content"][0]["is_error"] is True


async def test_claude_engine_invalid_tool_json_is_an_error_result(claude, token):
    def ev(name, data):
        return (name, {"type": name, **data})

    start = {"message": {"id": "msg_bad", "type": "message", "role": "assistant", "model": MODEL, "content": [],
                         "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}
    claude.script(
        raw_stream([
            ev("message_start", start),
            ev("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "id": "t_bad",
                                                                     "name": "read_file", "input": {}}}),
            ev("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"path": '}}),
            ev("content_block_stop", {"index": 0}),
            ev("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 3}}),
            ev("message_stop", {}),
        ]),
        text_reply("Sorry."),
    )
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "x"})
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] is True and "JSON object" in result["output"]
    assert events[-1]["type"] == "done"
    assistant = _messages(claude.requests[1])[1]["content"][0]
    assert assistant == {"type": "tool_use", "id": "t_bad", "name": "read_file", "input": {}}


async def test_claude_engine_stops_at_the_step_limit(claude, token, agents, analyst_workspace):
    (analyst_workspace / "a.txt").write_text("A")
    await Agent.objects.filter(role=ANALYST).aupdate(max_steps=2)
    claude.script(tool_use_reply("read_file", {"path": "a.txt"}, times=5))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "loop forever"})
    assert len(claude.requests) == 2
    assert types(events).count("tool_result") == 1
    assert events[-1]["type"] == "done" and "step limit of 2" in events[-1]["content"]


# --- approvals ------------------------------------------------------------------------------------

async def _pending_confirmation() -> ToolConfirmation:
    async def find():
        return await ToolConfirmation.objects.filter(status="pending").afirst()

    return await wait_for(find, timeout=10)


@pytest.mark.parametrize("approved", [True, False])
async def test_claude_engine_write_file_waits_for_approval(claude, token, user, analyst_workspace, approved):
    claude.script(
        tool_use_reply("write_file", {"path": "report.md", "content": "# Report"}, id="t_write"),
        text_reply("Written." if approved else "Not written."),
    )
    stream = asyncio.create_task(post_stream(token, {"agent_role": ANALYST, "message": "write the report"}))
    confirmation = await _pending_confirmation()
    await asyncio.sleep(0.3)  # the run is waiting: nothing was written and the model was not called again
    assert not (analyst_workspace / "report.md").exists() and len(claude.requests) == 1
    await sync_to_async(tool_confirmation_decide)(user=user, confirmation_id=str(confirmation.id), approved=approved)
    _, events = await asyncio.wait_for(stream, timeout=15)

    assert types(events)[:3] == ["tool_use", "tool_use", "tool_result"]
    assert events[1] == {"type": "tool_use", "id": "t_write", "name": "write_file",
                         "input": {"path": "report.md", "content": "# Report"},
                         "status": "awaiting_input", "confirmation_id": str(confirmation.id)}
    result = events[2]
    sent_back = _messages(claude.requests[1])[-1]["content"][0]
    if approved:
        assert (analyst_workspace / "report.md").read_text() == "# Report"
        assert result["is_error"] is False and result["status"] == "succeeded"
        assert sent_back["is_error"] is False
    else:
        assert not (analyst_workspace / "report.md").exists()
        assert result["is_error"] is True and result["status"] == "denied" and "denied" in result["output"]
        assert sent_back["is_error"] is True and "denied" in sent_back["content"]
    assert events[-1]["type"] == "done"


# --- confinement -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "/proc/self/environ"])
async def test_claude_engine_read_file_outside_workspace_is_refused(claude, token, analyst_workspace, path):
    claude.script(tool_use_reply("read_file", {"path": path}, id="t_escape"), text_reply("Refused."))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "read it"})
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] is True
    assert "root:" not in result["output"]
    assert _messages(claude.requests[1])[-1]["content"][0]["is_error"] is True


async def test_claude_engine_bash_does_not_leak_server_environment(claude, token, agents, analyst_workspace,
                                                                   monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-canary-api-key")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "canary-auth-token")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "canary-secret-key")
    monkeypatch.setenv("DATABASE_URL", "postgres://canary:pw@db/x")
    await ToolRule.objects.acreate(scope="agent", agent=agents[ANALYST], effect="allow", tool="bash")
    claude.script(tool_use_reply("bash", {"command": "env; echo key=[$ANTHROPIC_API_KEY]"}, id="t_env"),
                  text_reply("done"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "print env"})
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] is False and "key=[]" in result["output"]
    for canary in ("sk-canary-api-key", "canary-auth-token", "canary-secret-key", "canary:pw", "test-key"):
        assert canary not in result["output"]


# --- provider errors -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "status,code,words",
    [
        (401, "authentication_failed", "rejected the API key"),
        (403, "permission_denied", "not allowed"),
        (404, "model_not_found", MODEL),
        (429, "rate_limited", "rate-limiting"),
        (500, "provider_error", "internal error"),
        (529, "provider_overloaded", "overloaded"),
    ],
)
async def test_claude_engine_http_errors_end_as_error_event(claude, token, status, code, words, caplog):
    claude.script(http_error(status, "upstream says no"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    assert types(events) == ["error"]
    (error,) = events
    assert error["code"] == code
    assert words in error["message"] and "upstream says no" in error["message"] and f"HTTP {status}" in error["message"]
    assert "dev_efficiency_analyst" in error["message"]  # the service adds agent/engine/model context
    assert len(claude.requests) == 1  # ANTHROPIC_MAX_RETRIES=0: no retries anywhere
    assert any("claude request failed" in r.getMessage() and code in r.getMessage() for r in caplog.records)
    run = await Run.objects.aget(id=(await Run.objects.alatest("started_at")).id)
    assert run.status == "failed" and code in (await _last_end(run))["errorCode"]


async def _last_end(run: Run) -> dict:
    from chat_app.models import RunEvent
    from tests.conftest import wait_for

    # The seed-000 stream ends at its `error` event; agent.end is recorded right after it.
    row = await wait_for(lambda: RunEvent.objects.filter(run=run, event="agent.end").afirst(), timeout=10)
    return row.payload


async def test_claude_engine_sdk_retries_are_the_only_retries(claude, token, settings):
    settings.ANTHROPIC_MAX_RETRIES = 1
    claude.script(http_error(529, times=2, retry_after_ms=1), text_reply("never reached"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    assert events[-1]["code"] == "provider_overloaded"
    assert len(claude.requests) == 2  # the SDK's one retry, nothing stacked on top
    assert claude.pending == 1


async def test_claude_engine_connection_refused_names_base_url(claude, token, settings):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.ANTHROPIC_BASE_URL = f"http://127.0.0.1:{port}"
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    (error,) = events
    assert error["type"] == "error" and error["code"] == "provider_unreachable"
    assert "connection refused" in error["message"]
    assert f"127.0.0.1:{port}" in error["message"]


async def test_claude_engine_error_event_mid_stream(claude, token):
    claude.script(mid_stream_error(error_type="overloaded_error", message="Overloaded"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    assert events[0] == {"type": "content_delta", "content": "Hel"}
    assert types(events) == ["content_delta", "error"]
    assert events[1]["code"] == "provider_overloaded"
    assert "middle of its answer" in events[1]["message"] and "Overloaded" in events[1]["message"]
    assert not await Message.objects.filter(role="assistant").aexists()  # no partial answer saved


async def test_claude_engine_mid_stream_error_classified_by_type(claude, token):
    claude.script(mid_stream_error(error_type="rate_limit_error", message="slow down"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    assert events[-1]["type"] == "error" and events[-1]["code"] == "rate_limited"


async def test_claude_engine_stall_past_deadline_times_out(claude, token, settings):
    settings.ANTHROPIC_TIMEOUT = 0.5
    claude.script(stall())
    loop = asyncio.get_running_loop()
    started = loop.time()
    _, events = await asyncio.wait_for(post_stream(token, {"agent_role": ANALYST, "message": "hi"}), timeout=10)
    assert loop.time() - started < 5
    assert types(events) == ["content_delta", "error"]
    assert events[-1]["code"] == "provider_timeout" and "0.5 s" in events[-1]["message"]


async def test_claude_engine_stall_deadline_covers_tool_turns_separately(claude, token, settings, analyst_workspace):
    # The deadline is per request: a slow tool between requests does not count against it.
    settings.ANTHROPIC_TIMEOUT = 2.0
    (analyst_workspace / "a.txt").write_text("A")
    claude.script(tool_use_reply("read_file", {"path": "a.txt"}), text_reply(["fine"], delay=0.05))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "hi"})
    assert events[-1]["type"] == "done"


async def test_claude_engine_joins_many_json_fragments(claude, token, analyst_workspace):
    (analyst_workspace / "deep.json").write_text("{}")
    payload = {"path": "deep.json"}
    claude.script(tool_use_reply("read_file", payload, id="t_frag", json_chunks=9), text_reply("ok"))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "x"})
    assert next(e for e in events if e["type"] == "tool_use")["input"] == payload
    assert json.loads(json.dumps(_messages(claude.requests[1])[1]["content"][0]["input"])) == payload


async def test_claude_engine_empty_reply_still_ends_done(claude, token):
    claude.script(message_reply(text_block([""])))
    _, events = await post_stream(token, {"agent_role": ANALYST, "message": "x"})
    assert events == [events[-1]] and events[-1]["type"] == "done" and events[-1]["content"] == ""
