"""How a run's events are recorded: one row per event, the payload and time the stream showed."""
from __future__ import annotations

import json
import math
import random
from datetime import datetime, timezone

import pytest
from asgiref.sync import sync_to_async

from chat_app import services
from chat_app.eventlog import LiveRun, LiveSubscription, StoredSubscription, _aware_time, _sqlite_time
from chat_app.models import RunEvent
from core.events import RecordedEvent, TextDelta, Thought, to_json

TRICKY = ["", "tok ", 'say "hi"', "back\\slash", "line\nbreak\ttab", "\x00\x1f\x7f", "\u2028\u2029", "é 中文 😀",
          "\ud800 lone surrogate", "</script>"]


@pytest.mark.parametrize("text", TRICKY)
@pytest.mark.parametrize("agent", ["", "coder", "ag\"ent"])
def test_text_delta_json_is_the_generic_encoding(text, agent):
    delta = TextDelta(text=text, agent=agent)
    assert delta.to_json() == to_json(delta.to_dict()) == TextDelta.json_of(text, agent)
    assert RecordedEvent("r", 2, delta).payload_json == to_json({"text": text, "agent": agent})
    assert json.loads(delta.to_json()) == {"text": text, "agent": agent}


def test_event_json_of_other_events_and_stored_payloads_is_unchanged():
    thought = Thought(text="hmm", agent="a")
    assert RecordedEvent("r", 1, thought).payload_json == '{"text":"hmm","agent":"a"}'
    stored = RecordedEvent.from_payload("r", 3, "agent.delta", {"text": "x", "agent": "", "extra": 1})
    assert stored.payload_json == '{"text":"x","agent":"","extra":1}'


def _timestamps() -> list[float]:
    rng = random.Random(7)
    now = datetime.now(timezone.utc).timestamp()
    stamps = [0.0, 1.0, 1.5, 1e9 + 0.9999995, 1e9 + 0.0000005, 1e9 + 0.0000015, 1795467348.9999996,
              1795467348.0000004, now, float(int(now))]
    for _ in range(2000):
        base = rng.choice([now + rng.uniform(-1e5, 1e5), rng.uniform(0, 4e9)])
        stamps += [base, math.floor(base) + rng.randint(0, 2_000_000) / 2e6, math.nextafter(base, 0)]
    return stamps


def test_row_times_are_the_datetime_of_the_timestamp():
    for ts in _timestamps():
        expected = datetime.fromtimestamp(ts, tz=timezone.utc)
        assert _sqlite_time(ts) == expected.replace(tzinfo=None).isoformat(" "), ts
        assert datetime.fromisoformat(_aware_time(ts)) == expected, ts


async def test_live_subscription_hands_out_typed_events_in_order():
    live = LiveRun("run-x", first=RecordedEvent("run-x", 1, Thought(text="start")))
    published = []
    for text in ["a", "b", "c"]:
        recorded = live.make(TextDelta(text=text, agent="coder"))
        live.publish(recorded, persist=False)
        published.append(recorded)
    batch = await LiveSubscription(live, after_seq=1).next()
    assert [(e.seq, e.event, e.ts, e.run_id) for e in batch] == [(r.seq, r.event, r.ts, r.run_id) for r in published]
    assert all(type(e.data) is TextDelta for e in batch)
    assert [(e.data.text, e.data.agent) for e in batch] == [("a", "coder"), ("b", "coder"), ("c", "coder")]
    assert [e.payload_json for e in batch] == [r.payload_json for r in published]
    assert [e.seq for e in await LiveSubscription(live, after_seq=2).next()] == [3, 4]


@pytest.mark.django_db(transaction=True)
async def test_every_streamed_event_is_a_row_with_its_payload_seq_and_time(user):
    words = " ".join(f"w{i}" for i in range(300))
    created = await services.run_start(user=user, input=f'{words} "quoted" \\ é 😀', agent_role="coder")
    streamed = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    assert sum(e.event == "agent.delta" for e in streamed) > 50
    rows = await sync_to_async(list)(
        RunEvent.objects.filter(run=created.run).order_by("seq").values_list("seq", "event", "at", "payload"))
    assert [(seq, name, payload) for seq, name, _, payload in rows] == [(e.seq, e.event, e.payload) for e in streamed]
    assert [at for _, _, at, _ in rows] == [datetime.fromtimestamp(e.ts, tz=timezone.utc) for e in streamed]
    stored = StoredSubscription(str(created.run.id), 0, find_live=lambda run_id: None)  # as another process reads it
    replayed = [e async for e in stored]
    assert [(e.seq, e.event, e.payload, e.at) for e in replayed] == [(e.seq, e.event, e.payload, e.at) for e in streamed]


async def test_a_merging_reader_gets_what_coalesce_makes_of_the_batch():
    from chat_app.transports.base import coalesce

    live = LiveRun("run-m")
    items = [TextDelta("a"), TextDelta("b"), TextDelta("c", agent="x"), Thought("t"), TextDelta("d"),
             TextDelta("e"), TextDelta("f", agent="x"), TextDelta("g", agent="x")]
    for data in items:
        live.publish(live.make(data), persist=False)
    every = await LiveSubscription(live).next()
    merging = LiveSubscription(live)
    merging.merge_deltas = True
    merged = await merging.next()
    expected = coalesce(every)
    assert [(e.seq, e.event, e.ts, e.payload_json) for e in merged] == [(e.seq, e.event, e.ts, e.payload_json) for e in expected]
    assert [e.payload["text"] for e in merged] == ["ab", "c", "t", "de", "fg"]


@pytest.mark.parametrize("text", TRICKY[:-2] + ["tab\there", "\b\f\v\r", "\\n not a newline"])
def test_copy_text_is_what_psycopg_writes_for_the_rows(text):
    pytest.importorskip("psycopg")
    from psycopg._copy_base import TextFormatter
    from psycopg.adapt import Transformer

    from chat_app.eventlog import _compact, _copy_text
    from core.events import RunEnded, ToolCallState, UnknownEvent

    events = [RecordedEvent("r", 5, TextDelta(text=text, agent=text)),
              RecordedEvent("r", 6, ToolCallState(tool_call_id="t1", name="x", status="running", input={text: [text, 1, None]},
                                                  output=text)),
              RecordedEvent("r", 7, UnknownEvent(name=f"odd\t{text}".replace("\x00", ""), payload={"k": text})),
              RecordedEvent("r", 123456, RunEnded(status="succeeded", text=text))]
    formatter = TextFormatter(Transformer())
    for e in events:
        formatter.write_row(("run-key", e.seq, e.event, _aware_time(e.ts), e.payload_json))
    assert _copy_text("run-key", [_compact(events[0]), *events[1:]]).encode() == bytes(formatter.end())


async def test_wait_output_returns_at_the_first_event_after_the_start_or_at_the_end():
    import asyncio

    live = LiveRun("run-w", first=RecordedEvent("run-w", 1, Thought(text="start")))
    waiting = asyncio.ensure_future(live.wait_output())
    await asyncio.sleep(0.05)
    assert not waiting.done()  # agent.start alone is no output
    live.publish(live.make(TextDelta(text="a", agent="")), persist=False)
    await asyncio.wait_for(waiting, 5)
    await asyncio.wait_for(live.wait_output(), 5)  # and at once afterwards

    silent = LiveRun("run-s", first=RecordedEvent("run-s", 1, Thought(text="start")))
    waiting = asyncio.ensure_future(silent.wait_output())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    silent.finish_unrecorded()  # a run that ends without output ends the wait too
    await asyncio.wait_for(waiting, 5)
