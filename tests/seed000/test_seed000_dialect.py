"""The seed-000 mapping on a recorded canonical event sequence (no server, no database)."""
from __future__ import annotations

from chat_app.transports.chat_stream import ChatStreamDialect
from core.events import (
    AssistantMessage,
    ContextPatch,
    RecordedEvent,
    RunEnded,
    RunError,
    RunStarted,
    TextDelta,
    ToolCallState,
)

RUN, CONV = "run-1", "conv-1"


def _recorded(events) -> list[RecordedEvent]:
    return [RecordedEvent(RUN, i, e) for i, e in enumerate(events, start=1)]


def _translate(events) -> list[dict]:
    dialect = ChatStreamDialect(run_id=RUN, conversation_id="")
    return [item for recorded in _recorded(events) for item in dialect.translate(recorded)]


def test_seed000_translator_maps_a_full_tool_run():
    call = dict(tool_call_id="toolu_1", name="write_file", input={"path": "a.md", "content": "x"})
    out = _translate([
        RunStarted(run_id=RUN, conversation_id=CONV, agent_role="dev_efficiency_analyst", engine="claude", model="m"),
        TextDelta(text="Writing"),
        TextDelta(text=""),
        ToolCallState(status="pending", **call),
        ToolCallState(status="awaiting_input", confirmation_id="conf-1", **call),
        ToolCallState(status="running", confirmation_id="conf-1", **call),
        ToolCallState(status="succeeded", output="OK: Wrote 1 chars to a.md", confirmation_id="conf-1", **call),
        ContextPatch(kind="step", data={}),
        TextDelta(text=" done."),
        AssistantMessage(message_id="msg-1", content="Writing done."),
        RunEnded(status="succeeded", usage={"input_tokens": 3, "output_tokens": 4}, message_id="msg-1",
                 session_id="claude-x", text="Writing done."),
    ])
    assert out == [
        {"type": "content_delta", "content": "Writing"},
        {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {"path": "a.md", "content": "x"}},
        {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {"path": "a.md", "content": "x"},
         "status": "awaiting_input", "confirmation_id": "conf-1"},
        {"type": "tool_result", "tool_use_id": "toolu_1", "name": "write_file", "output": "OK: Wrote 1 chars to a.md",
         "is_error": False, "status": "succeeded"},
        {"type": "content_delta", "content": " done."},
        {"type": "done", "content": "Writing done.", "conversation_id": CONV, "run_id": RUN, "message_id": "msg-1",
         "usage": {"input_tokens": 3, "output_tokens": 4}},
    ]


def test_seed000_translator_maps_failed_and_denied_tools_as_error_results():
    call = dict(tool_call_id="t", name="bash", input={"command": "rm -rf /"})
    out = _translate([
        ToolCallState(status="denied", error="The user denied this tool call; it was not run.", **call),
        ToolCallState(status="failed", error="confirmation expired", **call),
    ])
    assert out == [
        {"type": "tool_result", "tool_use_id": "t", "name": "bash", "is_error": True, "status": "denied",
         "output": "The user denied this tool call; it was not run."},
        {"type": "tool_result", "tool_use_id": "t", "name": "bash", "is_error": True, "status": "failed",
         "output": "confirmation expired"},
    ]


def test_seed000_translator_error_then_end_gives_one_error_event():
    out = _translate([
        TextDelta(text="Hel"),
        RunError(code="provider_overloaded", message="The model provider is overloaded"),
        RunEnded(status="failed", error="The model provider is overloaded", error_code="provider_overloaded"),
    ])
    assert out == [
        {"type": "content_delta", "content": "Hel"},
        {"type": "error", "message": "The model provider is overloaded", "code": "provider_overloaded"},
    ]


def test_seed000_translator_cancelled_run_ends_with_error():
    out = _translate([RunEnded(status="cancelled", error="Run was cancelled.", error_code="cancelled")])
    assert out == [{"type": "error", "message": "Run was cancelled.", "code": "cancelled"}]
