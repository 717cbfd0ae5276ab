"""The seed's JSON-action parser, the live answer streamer and the history prefix."""
from __future__ import annotations

import json

import pytest

from agents_app.engines.ollama import AnswerStreamer, parse_action, with_history

DEFAULTS = {"thought": "", "action": "final", "tool": None, "target_agent": None, "args": {}, "answer": ""}


def test_parse_action_direct_json_gets_missing_keys():
    assert parse_action('{"action": "use_tool", "tool": "read_file"}') == {
        **DEFAULTS, "action": "use_tool", "tool": "read_file"}


@pytest.mark.parametrize("raw", [
    'Here you go:\n```json\n{"action": "final", "answer": "42"}\n```\nHope that helps!',
    'Sure! {"action": "final", "answer": "42"} Bye.',
])
def test_parse_action_takes_json_inside_prose_or_fence(raw):
    assert parse_action(raw) == {**DEFAULTS, "answer": "42"}


@pytest.mark.parametrize("raw", ["just words", "", "{not json}", "[1, 2]", '"a string"'])
def test_parse_action_falls_back_to_text_as_final_answer(raw):
    assert parse_action(raw) == {"thought": "JSON parsing failed", "action": "final", "tool": None,
                                 "target_agent": None, "args": {}, "answer": raw}


def _stream(text: str, size: int) -> tuple[str, AnswerStreamer]:
    streamer = AnswerStreamer()
    out = "".join(streamer.feed(text[i:i + size]) for i in range(0, len(text), size))
    return out, streamer


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_answer_streamer_releases_final_answer_across_any_chunking(size, ascii_only):
    answer = 'Tab\there, "quotes", back\\slash, é, 😀, \\u0041 and a\nnew line'
    text = json.dumps({"thought": "t", "action": "final", "args": {"answer": "nested, not this"},
                       "answer": answer}, ensure_ascii=ascii_only)
    out, streamer = _stream(text, size)
    assert out == answer and streamer.action == "final"


def test_answer_streamer_waits_for_action_when_answer_comes_first():
    streamer = AnswerStreamer()
    assert streamer.feed('{"answer": "early bird", ') == ""
    assert streamer.feed('"action": "final"}') == "early bird"


@pytest.mark.parametrize("text", [
    '{"action": "use_tool", "tool": "x", "answer": "not for the user"}',
    '```json\n{"action": "final", "answer": "fenced"}\n```',
    'plain text',
])
def test_answer_streamer_releases_nothing_unless_a_final_json_object(text):
    out, _ = _stream(text, 3)
    assert out == ""


def test_with_history_prepends_earlier_turns():
    history = [{"role": "user", "content": "remember apples"}, {"role": "assistant", "content": "ok"}]
    assert with_history("what fruit?", history) == (
        "Conversation so far:\nuser: remember apples\nassistant: ok\n\nCurrent request:\nwhat fruit?")
    assert with_history("what fruit?", []) == "what fruit?"
