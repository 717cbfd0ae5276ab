"""``POST /chat`` (seed 004 §8.2) and the same runs on ``/v1/agent/chat`` and the timeline."""
from __future__ import annotations

import asyncio
import json

import pytest

from chat_app.models import Message, Run
from tests.agent_chat.conftest import events_of, run_events_of
from tests.fakes.ollama_server import action, model_not_found, reply

from .conftest import MODEL, user_query

pytestmark = pytest.mark.django_db(transaction=True)

# The seed's curl example, byte for byte.
SEED_BODY = {"messages": [{"role": "user", "content": [
    {"type": "text", "text": "Write a Python function to calculate fibonacci"}]}]}


def _tool_and_delegate_script(settings):
    (settings.WORKSPACES_ROOT / "orchestrator").mkdir(parents=True, exist_ok=True)
    (settings.WORKSPACES_ROOT / "orchestrator" / "spec.txt").write_text("fib(0)=0, fib(1)=1")
    return [
        action("Check the spec.", "use_tool", tool="read_file", args={"path": "spec.txt"}),
        action("Coder's job.", "delegate", target_agent="coder", args={"task": "Write fib per spec"}),
        action("Test it.", "use_tool", tool="run_python",
               args={"code": "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\nresult = fib(10)"}),
        action("Works.", "final", answer="def fib(n): ... (fib(10) = 55)"),
    ]


EXPECTED_EVENTS = [
    {"step": 1, "agent": "orchestrator", "action": "use_tool", "tool": "read_file", "target_agent": None,
     "thought": "Check the spec."},
    {"step": 2, "agent": "orchestrator", "action": "delegate", "tool": None, "target_agent": "coder",
     "thought": "Coder's job."},
    {"step": 3, "agent": "coder", "action": "use_tool", "tool": "run_python", "target_agent": None, "thought": "Test it."},
    {"step": 4, "agent": "coder", "action": "final", "tool": None, "target_agent": None, "thought": "Works."},
]


async def test_chat_seed_request_returns_answer_and_events(chat, trio, ollama):
    ollama.script(action("Simple.", "final", answer="def fib(n): ..."))
    response = await chat.post_json("/chat", SEED_BODY)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answer"] == "def fib(n): ..."
    assert body["events"] == [{"step": 1, "agent": "orchestrator", "action": "final", "tool": None,
                               "target_agent": None, "thought": "Simple."}]
    assert user_query(ollama.chat_requests()[0]) == "Write a Python function to calculate fibonacci"
    # Persisted like any other run.
    run = await Run.objects.aget(id=body["runId"])
    assert str(run.conversation_id) == body["conversationId"]
    assert run.status == "succeeded" and run.engine == "ollama" and run.model == MODEL
    roles = [m.role async for m in Message.objects.filter(run=run).order_by("created_at")]
    assert roles == ["user", "assistant"]


async def test_chat_tools_and_delegation_show_in_events_and_timeline(chat, trio, ollama, settings):
    ollama.script(*_tool_and_delegate_script(settings))
    response = await chat.post_json("/chat", SEED_BODY)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answer"] == "def fib(n): ... (fib(10) = 55)"
    assert body["events"] == EXPECTED_EVENTS

    status, timeline = await chat.json("GET", f"/v1/agent/runs/{body['runId']}/timeline")
    assert status == 200 and timeline["status"] == "succeeded"
    patches = [e["payload"] for e in timeline["events"] if e["event"] == "context.patch"]
    assert [p["data"] for p in patches if p["kind"] == "step"] == EXPECTED_EVENTS
    assert [p["data"]["to"] for p in patches if p["kind"] == "delegation"] == ["coder"]
    tools = [(e["payload"]["name"], e["payload"]["status"]) for e in timeline["events"] if e["event"] == "tool.state"]
    assert tools == [("read_file", "pending"), ("read_file", "running"), ("read_file", "succeeded"),
                     ("run_python", "pending"), ("run_python", "running"), ("run_python", "succeeded")]
    assert "EXEC_OK: {'result': 55}" in user_query(ollama.chat_requests()[3])


async def test_chat_accepts_plain_string_content_and_uses_latest_user_text(chat, trio, ollama):
    ollama.script(action("", "final", answer="ok"))
    body = {"messages": [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": [{"type": "text", "text": "first answer"}]},
        {"role": "user", "content": "second question"},
        {"role": "user", "content": [{"type": "image", "image": "data:..."}]},
    ]}
    response = await chat.post_json("/chat", body)
    assert response.status_code == 200, response.content
    # Like the seed: the latest user message with text; the turns before it are context.
    assert user_query(ollama.chat_requests()[0]) == (
        "Conversation so far:\nuser: first question\nassistant: first answer\n\nCurrent request:\nsecond question")


@pytest.mark.parametrize("messages", [
    [],
    [{"role": "assistant", "content": "only me"}],
    [{"role": "user", "content": []}],
    [{"role": "user", "content": [{"type": "image", "image": "x"}]}],
    [{"role": "user"}],
    [{"role": "user", "content": None}],
])
async def test_chat_without_text_sends_seed_placeholder(chat, trio, ollama, messages):
    ollama.script(action("", "final", answer="Please ask something."))
    response = await chat.post_json("/chat", {"messages": messages})
    assert response.status_code == 200, response.content
    assert user_query(ollama.chat_requests()[0]) == "No text content provided."


@pytest.mark.parametrize("raw", [
    b"{not json",
    b"[]",
    b'"text"',
    b"{}",
    b'{"messages": "hello"}',
    b'{"messages": null}',
    b'{"messages": ["hello"]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "conversationId": "nope"}',
])
async def test_chat_malformed_body_is_400_json(chat, trio, ollama, raw):
    response = await chat.post_json("/chat", raw)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] in {"malformed_json", "invalid_input"} and body["message"]
    assert ollama.chat_requests() == []
    assert not await Run.objects.aexists()


async def test_chat_requires_authentication(trio, ollama):
    from tests.agent_chat.conftest import AsgiClient

    response = await AsgiClient().request("POST", "/chat", body=json.dumps(SEED_BODY).encode(),
                                          headers={"Content-Type": "application/json"})
    assert response.status_code == 401 and response.json()["code"] == "not_authenticated"


async def test_chat_no_ollama_answering_falls_back_to_mock(chat, trio, settings, closed_port_url):
    """Seed 004's trio runs on Ollama; while none answers the router uses mock, says so, /health too."""
    settings.OLLAMA_URL = closed_port_url
    response = await chat.post_json("/chat", SEED_BODY)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answer"].startswith("Mock reply from orchestrator")
    run = await Run.objects.aget(id=body["runId"])
    assert run.engine == "mock" and f"no Ollama answering at {closed_port_url}" in run.route_note
    health = (await chat.client.request("GET", "/health")).json()
    assert health["engines"]["ollama"]["live"] is False and health["engines"]["ollama"]["fallback"] == "mock"
    assert health["engines"]["ollama"]["url"] == closed_port_url


async def test_chat_ollama_answering_probe_gets_ollama(chat, trio, ollama):
    ollama.script(action("done", "final", answer="real answer"))
    response = await chat.post_json("/chat", SEED_BODY)
    assert response.status_code == 200 and response.json()["answer"] == "real answer"
    health = (await chat.client.request("GET", "/health")).json()
    assert health["engines"]["ollama"]["live"] is True and health["engines"]["ollama"]["url"] == ollama.url


async def test_chat_ollama_gone_after_probe_is_502_naming_model_and_endpoint(chat, trio, ollama, settings):
    from agents_app.engines.ollama import OLLAMA_PROBE

    settings.OLLAMA_HEALTH_TTL = 300
    url = ollama.url
    assert (await asyncio.to_thread(OLLAMA_PROBE.result, url)).ok  # the cached probe saw it up...
    ollama.close()  # ...then it went away
    response = await chat.post_json("/chat", SEED_BODY)
    assert response.status_code == 502, response.content
    body = response.json()
    assert body["code"] == "provider_unreachable"
    assert MODEL in body["message"] and f"{url}/api/chat" in body["message"]
    run = await Run.objects.aget(id=body["runId"])
    assert run.status == "failed"


async def test_chat_missing_model_is_502(chat, trio, ollama):
    ollama.script(model_not_found())
    response = await chat.post_json("/chat", SEED_BODY)
    assert response.status_code == 502 and response.json()["code"] == "model_not_found"


async def test_chat_run_timeout_is_504(chat, trio, ollama, settings):
    from tests.fakes.ollama_server import stall

    settings.RUN_TIMEOUT = 0.5
    ollama.script(stall(after=1))
    response = await chat.post_json("/chat", SEED_BODY)
    assert response.status_code == 504 and response.json()["code"] == "run_timeout"


async def test_chat_continues_a_conversation(chat, trio, ollama):
    ollama.script(action("", "final", answer="Noted."), action("", "final", answer="Apples."))
    first = (await chat.post_json("/chat", {"messages": [{"role": "user", "content": "remember apples"}]})).json()
    second = await chat.post_json("/chat", {"messages": [{"role": "user", "content": "what fruit?"}],
                                            "conversationId": first["conversationId"]})
    assert second.status_code == 200 and second.json()["conversationId"] == first["conversationId"]
    assert user_query(ollama.chat_requests()[1]).startswith("Conversation so far:\nuser: remember apples\nassistant: Noted.")


# --- the same runs on /v1/agent/chat (seed-001 SSE) ----------------------------------------------

async def test_agent_chat_stream_shows_steps_tools_delegation_and_answer(chat, trio, ollama, settings):
    ollama.script(*_tool_and_delegate_script(settings))
    reader = await chat.chat({"input": "Write fib", "agentRole": "orchestrator"})
    frames = run_events_of(await reader.rest())
    names = [f.event for f in frames]
    assert names[0] == "agent.start" and names[-1] == "agent.end"
    assert frames[0].payload["engine"] == "ollama"
    steps = [f.payload["data"] for f in frames if f.event == "context.patch" and f.payload["kind"] == "step"]
    assert steps == EXPECTED_EVENTS
    tools = [(f.payload["name"], f.payload["status"]) for f in frames if f.event == "tool.state"]
    assert tools == [("read_file", "pending"), ("read_file", "running"), ("read_file", "succeeded"),
                     ("run_python", "pending"), ("run_python", "running"), ("run_python", "succeeded")]
    text = "".join(f.payload["text"] for f in frames if f.event == "agent.delta")
    assert text == "def fib(n): ... (fib(10) = 55)"
    # The answer streams live (before the final step's patch); no delta is a step's raw JSON.
    final_patch = max(i for i, f in enumerate(frames) if f.event == "context.patch")
    assert max(i for i, f in enumerate(frames) if f.event == "agent.delta") < final_patch
    assert all("{" not in f.payload["text"] for f in frames if f.event == "agent.delta")
    assert frames[-1].payload["status"] == "succeeded" and frames[-1].payload["text"] == text


@pytest.mark.parametrize(("script", "answer", "second_query", "max_steps"), [
    ([action("", "final", answer="At once.")], "At once.", None, None),
    ([action("", "use_tool", tool="teleport"), action("", "final", answer="A")], "A", "Unknown tool 'teleport'.", None),
    ([action("", "delegate", target_agent="wizard"), action("", "final", answer="A")], "A", "Unknown agent 'wizard'.", None),
    ([action("", "dance"), action("", "final", answer="A")], "A", "Invalid action 'dance'.", None),
    ([reply("no json at all")], "no json at all", None, None),
    ([reply('Okay:\n```json\n{"action": "final", "answer": "from prose"}\n```')], "from prose", None, None),
    ([action("", "delegate", target_agent="orchestrator", args={"task": "again"})] * 2,
     "[MAX STEPS REACHED - No final answer provided]", "again", 2),
])
async def test_agent_chat_stream_shows_each_loop_scenario(chat, trio, ollama, script, answer, second_query, max_steps):
    if max_steps:
        trio["orchestrator"].max_steps = max_steps
        await trio["orchestrator"].asave()
    ollama.script(*script)
    reader = await chat.chat({"input": "go", "agentRole": "orchestrator"})
    frames = run_events_of(await reader.rest())
    steps = [f.payload["data"] for f in frames if f.event == "context.patch" and f.payload["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, len(script) + 1))
    assert frames[-1].payload["status"] == "succeeded" and frames[-1].payload["text"] == answer
    assert "".join(f.payload["text"] for f in frames if f.event == "agent.delta") == answer
    if second_query:
        assert user_query(ollama.chat_requests()[1]).startswith(second_query)


async def test_agent_chat_stream_shows_mcp_bridge_success_and_error(chat, trio, ollama, mcp_server):
    mcp_server.respond("backtest", body={"pnl": 3})
    mcp_server.respond("crash", status=500, body="boom")
    ollama.script(
        action("", "use_tool", tool="mcp_trader", args={"tool": "backtest", "args": {}}),
        action("", "use_tool", tool="mcp_filesystem", args={"tool": "crash", "args": {}}),
        action("", "final", answer="pnl 3; filesystem failed"),
    )
    reader = await chat.chat({"input": "go", "agentRole": "orchestrator"})
    frames = run_events_of(await reader.rest())
    ends = [f.payload for f in frames if f.event == "tool.state" and f.payload["status"] in ("succeeded", "failed")]
    assert [(t["name"], t["status"]) for t in ends] == [("mcp_trader", "succeeded"), ("mcp_filesystem", "failed")]
    assert ends[0]["output"] == '{"pnl": 3}' and ends[1]["error"].startswith(f"ERROR(mcp:{mcp_server.url},crash)")
    assert frames[-1].payload["text"] == "pnl 3; filesystem failed"


async def test_agent_chat_stream_ollama_gone_after_probe_ends_failed(chat, trio, ollama, settings):
    from agents_app.engines.ollama import OLLAMA_PROBE

    settings.OLLAMA_HEALTH_TTL = 300
    url = ollama.url
    assert (await asyncio.to_thread(OLLAMA_PROBE.result, url)).ok
    ollama.close()
    reader = await chat.chat({"input": "hello", "agentRole": "orchestrator"})
    frames = run_events_of(await reader.rest())
    assert [f.event for f in frames][-2:] == ["error", "agent.end"]
    assert frames[-2].payload["code"] == "provider_unreachable"
    assert frames[-1].payload["status"] == "failed" and url in frames[-1].payload["error"]


async def test_chat_form_body_is_rejected_as_json(chat, trio, ollama):
    response = await chat.client.request("POST", "/chat", body=b"messages=hi", headers={
        **chat.headers, "Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 415 and response.json()["code"] == "unsupported_media_type"
