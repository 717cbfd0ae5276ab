"""The ACP dialect on a recorded event sequence (no process, no database)."""
from __future__ import annotations

from chat_app.transports.acp import AcpDialect, Notice, PermissionAsk, Update, stop_reason_for
from core.events import (AssistantMessage, ContextPatch, RecordedEvent, RunEnded, RunStarted, TextDelta,
                         ToolCallState)


def _events(*items):
    return [RecordedEvent("run-1", seq, item) for seq, item in enumerate(items, start=1)]


RUN = _events(
    RunStarted(run_id="run-1", conversation_id="c-1", agent_role="orchestrator", engine="ollama", model="m"),
    ContextPatch(kind="step", data={"step": 1, "agent": "orchestrator", "action": "use_tool", "tool": "write_file",
                                    "target_agent": "", "thought": "write it"}),
    ToolCallState(tool_call_id="t1", name="write_file", status="pending", input={"path": "a.txt", "content": "x"}),
    ToolCallState(tool_call_id="t1", name="write_file", status="awaiting_input", input={"path": "a.txt", "content": "x"},
                  confirmation_id="conf-1", policy={"effect": "ask"}),
    ToolCallState(tool_call_id="t1", name="write_file", status="running", input={"path": "a.txt", "content": "x"}),
    ToolCallState(tool_call_id="t1", name="write_file", status="succeeded", input={"path": "a.txt", "content": "x"},
                  output="wrote 1 byte"),
    ContextPatch(kind="step", data={"step": 2, "agent": "orchestrator", "action": "final", "tool": "",
                                    "target_agent": "", "thought": "done"}),
    TextDelta(text="Do"), TextDelta(text="ne"),
    AssistantMessage(message_id="m-1", content="Done"),
    RunEnded(status="succeeded", message_id="m-1", text="Done"),
)


def _translate(dialect, events):
    return [frame for event in events for frame in dialect.translate(event)]


def test_acp_dialect_maps_a_live_run():
    dialect = AcpDialect(run_id="run-1", conversation_id="c-1", workspace="/ws", max_steps=4,
                         notifications=["session/progress"])
    frames = _translate(dialect, RUN)
    kinds = [f.update.session_update if isinstance(f, Update) else type(f).__name__ for f in frames]
    assert kinds == ["Notice", "agent_thought_chunk", "plan", "Notice", "tool_call", "PermissionAsk",
                     "tool_call_update", "tool_call_update", "agent_thought_chunk", "plan", "Notice",
                     "agent_message_chunk", "agent_message_chunk", "plan", "Notice"]
    start = frames[4].update
    assert (start.status, start.kind, start.locations[0].path, start.content[0].type) == ("pending", "edit", "/ws/a.txt", "diff")
    ask = frames[5]
    assert isinstance(ask, PermissionAsk) and ask.confirmation_id == "conf-1"
    assert [frames[6].update.status, frames[7].update.status] == ["in_progress", "completed"]
    assert frames[7].update.content[0].content.text == "wrote 1 byte"
    assert [e.status for e in frames[9].update.entries] == ["completed", "in_progress"]
    assert [e.status for e in frames[13].update.entries] == ["completed", "completed"]
    assert [f.params["percent"] for f in frames if isinstance(f, Notice)] == [0, 25, 50, 100]
    assert dialect.finished and dialect.ended.status == "succeeded"


def test_acp_dialect_replay_sends_each_tool_call_once_with_its_final_state():
    dialect = AcpDialect(run_id="run-1", conversation_id="c-1", replay=True, notifications=["session/progress"])
    frames = _translate(dialect, RUN)
    assert all(isinstance(f, Update) for f in frames)
    kinds = [f.update.session_update for f in frames]
    assert kinds == ["agent_thought_chunk", "tool_call", "agent_thought_chunk", "agent_message_chunk", "agent_message_chunk"]
    assert frames[1].update.status == "completed" and frames[1].update.raw_output["output"] == "wrote 1 byte"


def test_acp_dialect_replay_shows_an_unfinished_call_as_failed():
    dialect = AcpDialect(run_id="run-1", conversation_id="c-1", replay=True)
    frames = _translate(dialect, _events(
        ToolCallState(tool_call_id="t1", name="bash", status="awaiting_input", input={"command": "ls"}, confirmation_id="c"),
        RunEnded(status="cancelled", error="Run was cancelled.", error_code="cancelled")))
    [frame] = frames
    assert (frame.update.session_update, frame.update.status, frame.update.title) == ("tool_call", "failed", "bash: ls")


def test_acp_stop_reasons():
    ok = RunEnded(status="succeeded")
    assert stop_reason_for(ok, {}) == "end_turn"
    assert stop_reason_for(ok, {"stopReason": "max_tokens"}) == "max_tokens"
    assert stop_reason_for(ok, {"stopReason": "refusal"}) == "refusal"
    assert stop_reason_for(ok, {"stopReason": "step_limit"}) == "max_turn_requests"
    assert stop_reason_for(RunEnded(status="cancelled"), {}) == "cancelled"
    assert stop_reason_for(RunEnded(status="failed", error_code="max_steps"), {}) == "max_turn_requests"
    assert stop_reason_for(RunEnded(status="failed", error_code="provider_error"), {}) is None
