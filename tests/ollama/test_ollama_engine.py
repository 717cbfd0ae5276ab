"""The ollama engine's JSON-action loop through the run service, against the scripted servers."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async

from agents_app.defaults import CODER_PROMPT, ORCHESTRATOR_PROMPT
from chat_app import services
from chat_app.models import Message
from tests.conftest import wait_for
from tests.fakes.ollama_server import action, action_json, model_not_found, reply, stall
from tools_app.models import ToolRule

from .conftest import MODEL, answer_of, run_turn, steps_of, tool_events, user_query

pytestmark = pytest.mark.django_db(transaction=True)

CONTINUE = "\n\nNow continue your reasoning and decide next action."


def step(n, agent, action_, tool=None, target_agent=None, thought=""):
    return {"step": n, "agent": agent, "action": action_, "tool": tool, "target_agent": target_agent, "thought": thought}


def _workspace(settings, role: str):
    path = settings.WORKSPACES_ROOT / role
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- the loop ------------------------------------------------------------------------------------

async def test_ollama_engine_final_at_step_one(user, trio, ollama):
    ollama.script(action("Easy one.", "final", answer="Hello there, human!", chunks=6))
    created, events = await run_turn(user, "Say hello")
    assert answer_of(events) == "Hello there, human!"
    assert steps_of(events) == [step(1, "orchestrator", "final", thought="Easy one.")]
    names = [e.event for e in events]
    assert names[0] == "agent.start" and names[-2:] == ["agent.message", "agent.end"]
    assert events[0].payload["engine"] == "ollama" and events[0].payload["provider"] == "ollama"
    # Only the answer is user text: streamed as deltas (as the model produced it), tagged with the agent.
    deltas = [e.payload for e in events if e.event == "agent.delta"]
    assert "".join(d["text"] for d in deltas) == "Hello there, human!" and len(deltas) > 1
    assert {d["agent"] for d in deltas} == {"orchestrator"}
    message = await Message.objects.aget(run_id=created.run.id, role="assistant")
    assert message.content == "Hello there, human!"
    assert message.metadata["events"] == steps_of(events)
    assert events[-1].payload["usage"] == {"input_tokens": 10, "output_tokens": 6}


async def test_ollama_engine_request_carries_model_json_format_temperature_prompt_stream(user, trio, ollama):
    ollama.script(action("t", "final", answer="ok"))
    await run_turn(user, "What is 2+2?")
    request = ollama.chat_requests()[0].json
    assert request["model"] == MODEL
    assert request["format"] == "json"
    assert request["options"] == {"temperature": 0.2}
    assert request["stream"] is True
    assert request["messages"] == [{"role": "system", "content": ORCHESTRATOR_PROMPT.strip()},
                                   {"role": "user", "content": "What is 2+2?"}]


async def test_ollama_engine_uses_agent_model_and_workspace_claude_md(user, trio, ollama, settings):
    agent = trio["orchestrator"]
    agent.model = "qwen2.5:7b"
    await agent.asave()
    (_workspace(settings, "orchestrator") / "CLAUDE.md").write_text("Prefer short answers.")
    ollama.script(action("t", "final", answer="ok"))
    await run_turn(user, "hi")
    request = ollama.chat_requests()[0].json
    assert request["model"] == "qwen2.5:7b"
    assert request["messages"][0]["content"].endswith("# Workspace instructions (CLAUDE.md)\n\nPrefer short answers.")


async def test_ollama_engine_non_streamed_option(user, trio, ollama):
    ollama.script(action("t", "final", answer="whole answer"))
    _, events = await run_turn(user, "hi", options={"stream": False})
    assert ollama.chat_requests()[0].json["stream"] is False
    assert answer_of(events) == "whole answer"
    assert "".join(e.payload["text"] for e in events if e.event == "agent.delta") == "whole answer"


async def test_ollama_engine_use_tool_then_final(user, trio, ollama, settings):
    (_workspace(settings, "orchestrator") / "notes.txt").write_text("the secret number is 7")
    ollama.script(
        action("Read the notes first.", "use_tool", tool="read_file", args={"path": "notes.txt"}),
        action("Found it.", "final", answer="The number is 7."),
    )
    _, events = await run_turn(user, "What number is in notes.txt?")
    assert answer_of(events) == "The number is 7."
    assert steps_of(events) == [step(1, "orchestrator", "use_tool", tool="read_file", thought="Read the notes first."),
                                step(2, "orchestrator", "final", thought="Found it.")]
    assert [t["status"] for t in tool_events(events)] == ["pending", "running", "succeeded"]
    assert tool_events(events, "succeeded")[0]["output"] == "the secret number is 7"
    # No user text while the tool step's JSON streamed in: the only deltas are the answer.
    assert "".join(e.payload["text"] for e in events if e.event == "agent.delta") == "The number is 7."

    first, second = ollama.chat_requests()
    assert user_query(second) == "Tool `read_file` output:\nthe secret number is 7" + CONTINUE
    context = second.json["messages"][1]
    assert context["role"] == "system" and context["content"].startswith("Context from previous steps:\n[orchestrator step 1] ")
    logged = json.loads(context["content"].split("[orchestrator step 1] ", 1)[1])
    assert logged["tool"] == "read_file" and logged["args"] == {"path": "notes.txt"} and logged["answer"] == ""
    assert len(first.json["messages"]) == 2  # no context message before the first step


async def test_ollama_engine_delegates_to_coder_then_final(user, trio, ollama, settings):
    ollama.script(
        action("A coding task.", "delegate", target_agent="coder", args={"task": "Compute 6*7 in Python"}),
        action("Run it.", "use_tool", tool="run_python", args={"code": "import os\nx = 6 * 7\ncwd = os.getcwd()"}),
        action("Done.", "final", answer="6*7 = 42"),
    )
    _, events = await run_turn(user, "Have the coder compute 6*7")
    assert answer_of(events) == "6*7 = 42"
    assert steps_of(events) == [
        step(1, "orchestrator", "delegate", target_agent="coder", thought="A coding task."),
        step(2, "coder", "use_tool", tool="run_python", thought="Run it."),
        step(3, "coder", "final", thought="Done."),
    ]
    delegation = [e.payload["data"] for e in events if e.event == "context.patch" and e.payload["kind"] == "delegation"]
    assert delegation == [{"step": 1, "from": "orchestrator", "to": "coder", "task": "Compute 6*7 in Python"}]
    _, to_coder, after_tool = ollama.chat_requests()
    assert to_coder.json["messages"][0]["content"] == CODER_PROMPT.strip()
    assert user_query(to_coder) == "Compute 6*7 in Python"
    assert "[orchestrator step 1]" in to_coder.json["messages"][1]["content"]
    # The coder's tool ran in the coder's own workspace.
    output = tool_events(events, "succeeded")[0]["output"]
    assert output.startswith("EXEC_OK: {'x': 42, 'cwd': ")
    assert f"'{(settings.WORKSPACES_ROOT / 'coder').resolve()}'" in output
    assert user_query(after_tool).startswith("Tool `run_python` output:\nEXEC_OK: {'x': 42")
    assert {d["agent"] for d in (e.payload for e in events if e.event == "agent.delta")} == {"coder"}


async def test_ollama_engine_delegate_without_task_sends_user_goal(user, trio, ollama):
    ollama.script(action("", "delegate", target_agent="researcher"), action("", "final", answer="done"))
    await run_turn(user, "Summarise the market")
    assert user_query(ollama.chat_requests()[1]) == "User goal: Summarise the market"


@pytest.mark.parametrize("tool", ["launch_rockets", "bash"])
async def test_ollama_engine_unknown_or_disallowed_tool_asks_orchestrator_for_final(user, trio, ollama, tool):
    ollama.script(
        action("Try it.", "use_tool", tool=tool, args={"command": "ls"}),
        action("Fine.", "final", answer="I cannot do that."),
    )
    _, events = await run_turn(user, "Do something odd")
    assert answer_of(events) == "I cannot do that."
    assert tool_events(events) == []  # nothing ran
    assert user_query(ollama.chat_requests()[1]) == (
        f"Unknown tool '{tool}'. Please provide a final answer with available information.")


async def test_ollama_engine_unknown_tool_from_delegate_goes_back_to_orchestrator(user, trio, ollama):
    ollama.script(
        action("", "delegate", target_agent="coder", args={"task": "t"}),
        action("", "use_tool", tool="nope"),
        action("", "final", answer="ok"),
    )
    _, events = await run_turn(user, "x")
    assert [s["agent"] for s in steps_of(events)] == ["coder" if i == 1 else "orchestrator" for i in range(3)]
    assert ollama.chat_requests()[2].json["messages"][0]["content"] == ORCHESTRATOR_PROMPT.strip()


async def test_ollama_engine_unknown_agent_returns_to_orchestrator(user, trio, ollama):
    ollama.script(
        action("Ask the wizard.", "delegate", target_agent="wizard", args={"task": "magic"}),
        action("Myself then.", "final", answer="Handled it myself."),
    )
    _, events = await run_turn(user, "Do magic")
    assert answer_of(events) == "Handled it myself."
    assert steps_of(events)[0] == step(1, "orchestrator", "delegate", target_agent="wizard", thought="Ask the wizard.")
    assert user_query(ollama.chat_requests()[1]) == (
        "Unknown agent 'wizard'. Please handle the task yourself or use available tools.")


async def test_ollama_engine_disabled_agent_is_unknown(user, trio, ollama):
    coder = trio["coder"]
    coder.enabled = False
    await coder.asave()
    ollama.script(action("", "delegate", target_agent="coder", args={"task": "t"}), action("", "final", answer="ok"))
    await run_turn(user, "x")
    assert user_query(ollama.chat_requests()[1]).startswith("Unknown agent 'coder'.")


async def test_ollama_engine_invalid_action_asks_for_final(user, trio, ollama):
    bad = action_json("Let's dance.", "dance")
    ollama.script(reply(bad), action("Sorry.", "final", answer="Here is the answer."))
    _, events = await run_turn(user, "x")
    assert answer_of(events) == "Here is the answer."
    assert steps_of(events)[0] == step(1, "orchestrator", "dance", thought="Let's dance.")
    parsed = {"thought": "Let's dance.", "action": "dance", "tool": None, "target_agent": None, "args": {}, "answer": ""}
    assert user_query(ollama.chat_requests()[1]) == (
        f"Invalid action 'dance'. Previous JSON: {json.dumps(parsed)}\nPlease provide a 'final' answer.")


async def test_ollama_engine_non_json_reply_is_the_final_answer(user, trio, ollama):
    ollama.script(reply("I'd rather just talk, no JSON today.", 4))
    _, events = await run_turn(user, "x")
    assert answer_of(events) == "I'd rather just talk, no JSON today."
    assert steps_of(events) == [step(1, "orchestrator", "final", thought="JSON parsing failed")]
    assert "".join(e.payload["text"] for e in events if e.event == "agent.delta") == "I'd rather just talk, no JSON today."


async def test_ollama_engine_json_inside_prose_is_parsed(user, trio, ollama, settings):
    (_workspace(settings, "orchestrator") / "a.txt").write_text("A")
    ollama.script(
        reply('Sure! Here is my action:\n```json\n{"thought": "read", "action": "use_tool", "tool": "read_file", '
              '"args": {"path": "a.txt"}}\n```'),
        reply('Final: {"thought": "ok", "action": "final", "answer": "It says A."} -- end'),
    )
    _, events = await run_turn(user, "x")
    assert answer_of(events) == "It says A."
    assert [s["action"] for s in steps_of(events)] == ["use_tool", "final"]
    assert tool_events(events, "succeeded")[0]["output"] == "A"


async def test_ollama_engine_missing_answer_is_no_answer(user, trio, ollama):
    ollama.script(action("nothing to say", "final"))
    _, events = await run_turn(user, "x")
    assert answer_of(events) == "[NO ANSWER]"


async def test_ollama_engine_stops_at_max_steps(user, trio, ollama):
    agent = trio["orchestrator"]
    agent.max_steps = 3
    await agent.asave()
    ollama.script(*[action("again", "delegate", target_agent="orchestrator", args={"task": "keep going"})] * 5)
    _, events = await run_turn(user, "loop forever")
    assert answer_of(events) == "[MAX STEPS REACHED - No final answer provided]"
    assert [s["step"] for s in steps_of(events)] == [1, 2, 3]
    assert len(ollama.chat_requests()) == 3
    assert "".join(e.payload["text"] for e in events if e.event == "agent.delta") == (
        "[MAX STEPS REACHED - No final answer provided]")


async def test_ollama_engine_second_turn_includes_history(user, trio, ollama):
    ollama.script(action("", "final", answer="Noted: apples."), action("", "final", answer="Apples."))
    first, events = await run_turn(user, "Remember apples")
    answer_of(events)
    _, events = await run_turn(user, "What did I ask you to remember?", conversation_id=str(first.conversation.id))
    assert answer_of(events) == "Apples."
    assert user_query(ollama.chat_requests()[1]) == (
        "Conversation so far:\nuser: Remember apples\nassistant: Noted: apples.\n\n"
        "Current request:\nWhat did I ask you to remember?")


# --- provider failures ---------------------------------------------------------------------------

async def test_ollama_engine_unreachable_fails_run_naming_model_and_endpoint(user, trio, ollama, settings):
    """Ollama answered the router's probe, then went away: the run fails readably (no fallback)."""
    from agents_app.engines.ollama import OLLAMA_PROBE

    settings.OLLAMA_HEALTH_TTL = 300
    closed_port_url = ollama.url
    assert (await asyncio.to_thread(OLLAMA_PROBE.result, closed_port_url)).ok
    ollama.close()
    created, events = await run_turn(user, "hello?")
    error = next(e.payload for e in events if e.event == "error")
    end = events[-1].payload
    assert end["status"] == "failed" and end["errorCode"] == error["code"] == "provider_unreachable"
    assert MODEL in end["error"] and f"{closed_port_url}/api/chat" in end["error"]
    assert not await Message.objects.filter(run_id=created.run.id, role="assistant").aexists()


async def test_ollama_engine_model_not_found_fails_run(user, trio, ollama):
    ollama.script(model_not_found())
    _, events = await run_turn(user, "hello?")
    assert events[-1].payload["errorCode"] == "model_not_found"
    assert f"model '{MODEL}' not found" in events[-1].payload["error"]


async def test_ollama_engine_cancel_mid_stream_stops_the_run(user, trio, ollama):
    ollama.script(stall(action("t", "final", answer="never finished"), after=1))
    created = await services.run_start(user=user, input="slow", agent_role="orchestrator")
    await asyncio.to_thread(ollama.wait_for_requests, 1, 5.0)
    await asyncio.wait_for(services.run_cancel(user=user, run_id=str(created.run.id)), 2)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    assert events[-1].payload["status"] == "cancelled"
    # The stream's worker thread stops at once too (it does not wait for OLLAMA_TIMEOUT).
    await wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("ollama-stream-")], timeout=2)


# --- tools through the engine --------------------------------------------------------------------

async def _tool_run(user, ollama, tool: str, args: dict, *, answer: str = "done"):
    ollama.script(action("use it", "use_tool", tool=tool, args=args), action("ok", "final", answer=answer))
    _, events = await run_turn(user, f"use {tool}")
    assert answer_of(events) == answer
    return events, user_query(ollama.chat_requests()[1])


async def test_ollama_engine_run_python_success_reports_variables(user, trio, ollama):
    events, fed_back = await _tool_run(user, ollama, "run_python", {"code": "print('hi')\nx = 6 * 7\nname = 'py'"})
    assert [t["status"] for t in tool_events(events)] == ["pending", "running", "succeeded"]
    assert tool_events(events, "succeeded")[0]["output"] == "hi\nEXEC_OK: {'x': 42, 'name': 'py'}"
    assert fed_back == "Tool `run_python` output:\nhi\nEXEC_OK: {'x': 42, 'name': 'py'}" + CONTINUE


async def test_ollama_engine_run_python_exception_is_fed_back(user, trio, ollama):
    events, fed_back = await _tool_run(user, ollama, "run_python", {"code": "1 / 0"})
    failed = tool_events(events, "failed")[0]
    assert failed["error"].endswith("EXEC_ERROR: ZeroDivisionError: division by zero")
    assert "EXEC_ERROR: ZeroDivisionError: division by zero" in fed_back


async def test_ollama_engine_run_python_timeout_is_fed_back(user, trio, ollama, settings):
    settings.TOOL_TIMEOUT = 1
    events, fed_back = await _tool_run(user, ollama, "run_python", {"code": "import time\ntime.sleep(30)"})
    assert "EXEC_ERROR: TimeoutError: run_python timed out after 1 s" in tool_events(events, "failed")[0]["error"]
    assert "timed out" in fed_back


async def test_ollama_engine_run_python_cannot_see_server_environment(user, trio, ollama, monkeypatch):
    monkeypatch.setenv("ORCH_TEST_SECRET", "s3cr3t-value")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-should-not-leak")
    code = ("import os\nleaked = sorted(k for k in os.environ if 'SECRET' in k or 'ANTHROPIC' in k)\n"
            "value = os.environ.get('ORCH_TEST_SECRET')")
    events, fed_back = await _tool_run(user, ollama, "run_python", {"code": code})
    assert tool_events(events, "succeeded")[0]["output"] == "EXEC_OK: {'leaked': [], 'value': None}"
    assert "s3cr3t" not in fed_back and "sk-should" not in fed_back


async def test_ollama_engine_run_python_waits_for_approval(user, trio, ollama):
    from tools_app.services import tool_confirmation_decide

    agent = trio["orchestrator"]
    # Without the trio's allow rule, run_python's default applies: a person approves each call.
    await ToolRule.objects.filter(agent=agent, tool="run_python").adelete()
    ollama.script(action("run", "use_tool", tool="run_python", args={"code": "y = 1"}), action("", "final", answer="ok"))
    created = await services.run_start(user=user, input="approve me", agent_role="orchestrator")
    events = []
    async for event in services.run_subscribe(run_id=str(created.run.id)):
        events.append(event)
        if event.event == "tool.state" and event.payload["status"] == "awaiting_input":
            assert len(ollama.chat_requests()) == 1  # the loop waits for the person
            await sync_to_async(tool_confirmation_decide)(
                user=user, confirmation_id=event.payload["confirmationId"], approved=True)
    assert answer_of(events) == "ok"
    assert [t["status"] for t in tool_events(events)] == ["pending", "awaiting_input", "running", "succeeded"]
    assert "EXEC_OK: {'y': 1}" in user_query(ollama.chat_requests()[1])


async def test_ollama_engine_mcp_bridges_success(user, trio, ollama, mcp_server):
    mcp_server.respond("backtest", body={"pnl": 12.5, "trades": 3})
    mcp_server.respond("list_files", body=["a.txt", "b.txt"])
    ollama.script(
        action("", "use_tool", tool="mcp_trader", args={"tool": "backtest", "args": {"symbol": "BTC"}}),
        action("", "use_tool", tool="mcp_filesystem", args={"tool": "list_files", "args": {"path": "/"}}),
        action("", "final", answer="PnL 12.5 over 3 trades; 2 files."),
    )
    _, events = await run_turn(user, "Backtest BTC and list files")
    assert answer_of(events) == "PnL 12.5 over 3 trades; 2 files."
    assert [r.json for r in mcp_server.requests] == [
        {"tool": "backtest", "args": {"symbol": "BTC"}}, {"tool": "list_files", "args": {"path": "/"}}]
    assert all(r.path == "/invoke" and r.method == "POST" for r in mcp_server.requests)
    assert [t["output"] for t in tool_events(events, "succeeded")] == ['{"pnl": 12.5, "trades": 3}', '["a.txt", "b.txt"]']
    requests = ollama.chat_requests()
    assert user_query(requests[1]) == 'Tool `mcp_trader` output:\n{"pnl": 12.5, "trades": 3}' + CONTINUE


async def test_ollama_engine_mcp_bridge_error_is_text_for_the_model(user, trio, ollama, mcp_server):
    mcp_server.respond("crash", status=500, body="boom")
    events, fed_back = await _tool_run(user, ollama, "mcp_trader", {"tool": "crash", "args": {}}, answer="It failed.")
    error = tool_events(events, "failed")[0]["error"]
    assert error.startswith(f"ERROR(mcp:{mcp_server.url},crash): 500 Server Error")
    assert fed_back.startswith(f"Tool `mcp_trader` output:\nERROR(mcp:{mcp_server.url},crash): ")


async def test_ollama_engine_mcp_bridge_unreachable_is_text_for_the_model(user, trio, ollama, settings, closed_port_url):
    settings.MCP_FILESYSTEM_URL = closed_port_url
    events, fed_back = await _tool_run(user, ollama, "mcp_filesystem", {"tool": "list_files"}, answer="down")
    assert tool_events(events, "failed")[0]["error"].startswith(f"ERROR(mcp:{closed_port_url},list_files): ")
