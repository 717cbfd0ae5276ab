"""The offline ``mock`` engine: deterministic, no provider, scriptable from the message text.

It streams its reply in several deltas. Lines of the user's message that start with a directive
script its behaviour, so every tool, confirmation and failure path can be exercised offline:

- ``/tool <name> <json input>``: call a tool (approval rules apply), then mention its output;
- ``/fail <message>``: end the run as failed with that message;
- ``/sleep <seconds>``: wait that long before answering (a slow model, for pings and cancel);
- ``/recall``: answer with the earlier turns it was given (shows resume/history context);
- ``/drip <count> <seconds>``: stream the reply in ``count`` pieces, one every ``seconds`` (a
  steady model).

Any other text is echoed back: ``Mock reply from <role>: <text>``.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import AsyncIterator

from core.events import RunEventBase, TextDelta

from .base import Engine, EngineContext, EngineError, EngineResult


def _chunks(text: str, words_per_chunk: int = 3) -> list[str]:
    words = text.split(" ")
    return [" ".join(words[i : i + words_per_chunk]) + (" " if i + words_per_chunk < len(words) else "")
            for i in range(0, len(words), words_per_chunk)]


class MockEngine(Engine):
    name = "mock"
    provider = "local"
    description = "Offline deterministic engine for development and tests."

    @classmethod
    def default_model(cls) -> str:
        return "mock-1"

    async def run(self, ctx: EngineContext) -> AsyncIterator[RunEventBase | EngineResult]:
        text_lines: list[str] = []
        notes: list[str] = []
        step = 0
        drip: tuple[int, float] | None = None
        for line in ctx.user_input.splitlines() or [""]:
            stripped = line.strip()
            if stripped.startswith("/tool "):
                step += 1
                if step > ctx.agent.max_steps:
                    notes.append("Step limit reached.")
                    break
                name, _, raw = stripped[len("/tool "):].partition(" ")
                try:
                    tool_input = json.loads(raw) if raw.strip() else {}
                except json.JSONDecodeError as exc:
                    raise EngineError(f"mock: invalid JSON for /tool {name}: {exc}", code="invalid_script")
                if not isinstance(tool_input, dict):
                    raise EngineError("mock: tool input must be a JSON object", code="invalid_script")
                result = await ctx.tools.call(tool_call_id=f"mock_{uuid.uuid4().hex[:12]}", name=name, input=tool_input)
                status = "error" if result.is_error else "ok"
                notes.append(f"Tool {name} {status}: {result.output[:200]}")
            elif stripped.startswith("/fail"):
                raise EngineError(stripped[len("/fail"):].strip() or "mock failure", code="mock_failure")
            elif stripped.startswith("/sleep"):
                try:
                    seconds = float(stripped[len("/sleep"):].strip() or "1")
                except ValueError:
                    raise EngineError("mock: /sleep takes a number of seconds", code="invalid_script")
                await asyncio.sleep(max(0.0, min(seconds, 3600.0)))
            elif stripped.startswith("/drip"):
                try:
                    count_text, _, pace_text = stripped[len("/drip"):].strip().partition(" ")
                    drip = (max(1, min(int(count_text), 100_000)), max(0.0, min(float(pace_text or "0"), 60.0)))
                except ValueError:
                    raise EngineError("mock: /drip takes a count and seconds between pieces", code="invalid_script")
            elif stripped == "/recall":
                turns = [f"{m['role']}: {m['content']}" for m in ctx.history]
                notes.append("Earlier turns: " + (" | ".join(turns) if turns else "none"))
            else:
                text_lines.append(line)

        said = "\n".join(text_lines).strip()
        reply = f"Mock reply from {ctx.agent.role}: {said}" if said else f"Mock reply from {ctx.agent.role}."
        if notes:
            reply += " " + " ".join(notes)
        if drip is not None:
            count, pace = drip
            size = max(1, -(-len(reply) // count))
            for start in range(0, len(reply), size):
                yield TextDelta(text=reply[start:start + size])
                await asyncio.sleep(pace)
        else:
            for chunk in _chunks(reply):
                yield TextDelta(text=chunk)
                await asyncio.sleep(0)
        usage = {"input_tokens": len(ctx.user_input.split()), "output_tokens": len(reply.split())}
        yield EngineResult(text=reply, usage=usage, session_id=ctx.session_id or f"mock-{uuid.uuid4().hex}")
