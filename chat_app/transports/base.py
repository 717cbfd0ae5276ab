"""The dialect interface, the dialect registry, and the one function that streams a run.

Every way a client reads a run (five HTTP dialects, ``/ws/chat``, ACP) is a :class:`Dialect`:
an object with the same hooks, registered by name, that turns typed run events into frames.
:func:`stream_run` drives any dialect over a run's subscription, so keep-alive pings,
resuming after a seq, coalescing of deltas for a slow reader and the disconnect policy exist
once, here. Transports (an SSE response, a WebSocket consumer, ACP over stdio) only write the
frames somewhere.

Frames are what the dialect's client receives: SSE text for the HTTP dialects (``encode`` is
the identity), JSON-able objects for ``/ws/chat`` (``encode`` gives their SSE form for the
seed-000 HTTP endpoint that shares the objects).
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, AsyncIterator, Awaitable, Callable, ClassVar

from core.events import RecordedEvent, TextDelta, to_json
from core.scheduling import detach
from orchestrator_site.registry import register_subclass

logger = logging.getLogger("orchestrator.transports")

Frame = Any
_DIALECTS: dict[str, type["Dialect"]] = {}
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}$")


class Dialect:
    """One client dialect: how a run's events look on one wire. One instance per stream."""

    name: ClassVar[str] = ""
    register: ClassVar[bool] = True
    media_type: ClassVar[str] = "text/event-stream; charset=utf-8"
    headers: ClassVar[dict[str, str]] = {}
    # Whether a client that goes away before the end cancels the run (seed 003 asks for it).
    cancel_on_disconnect: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_subclass(_DIALECTS, cls, kind="dialect", pattern=_NAME_RE)

    def __init__(self, *, run_id: str, conversation_id: str, conversation_created: bool = False,
                 after_seq: int = 0, **options: Any):
        self.run_id = str(run_id)
        self.conversation_id = str(conversation_id)
        self.conversation_created = conversation_created
        self.after_seq = after_seq
        self.last_seq = after_seq
        # Set by translate() once the client has everything it will get (its end frame).
        self.finished = False

    def opening(self) -> list[Frame]:
        """Frames before the first event (e.g. ``conversation.created``)."""
        return []

    def translate(self, event: RecordedEvent) -> list[Frame]:
        raise NotImplementedError

    def ping(self) -> list[Frame]:
        """A keep-alive; by default an SSE comment, which every EventSource ignores."""
        return [": ping\n\n"]

    def closing(self) -> list[Frame]:
        """Frames after the last event (also when the run's log ended without an end event)."""
        return []

    @staticmethod
    def encode(frame: Frame) -> str:
        return frame


def get_dialect(name: str) -> type[Dialect] | None:
    _load()
    return _DIALECTS.get(name)


def dialect_names() -> list[str]:
    _load()
    return sorted(_DIALECTS)


_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:  # an import statement costs even when the modules are loaded: every stream asks
        return
    from . import agent_chat, chat_stream, message_stream, vercel_ai  # noqa: F401  (register)
    _loaded = True


def sse_frame(data: Any, *, event: str | None = None, id: Any = None) -> str:
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event:
        lines.append(f"event: {event}")
    payload = data if isinstance(data, str) else to_json(data)
    if "\n" in payload:
        lines.extend(f"data: {line}" for line in payload.split("\n"))
    else:
        lines.append(f"data: {payload}")
    return "\n".join(lines) + "\n\n"


def coalesce(batch: list[RecordedEvent]) -> list[RecordedEvent]:
    """Merge consecutive text deltas of one agent into one event (its seq: the last one's).

    A batch holds what arrived while the reader was busy: merging it sends one frame instead of
    many, and never loses or reorders text.
    """
    if len(batch) < 2:
        return batch
    out: list[RecordedEvent] = []
    run: list[RecordedEvent] = []

    def close_run() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            last = run[-1]
            text = "".join(item.data.text for item in run)
            out.append(RecordedEvent(last.run_id, last.seq, TextDelta(text=text, agent=last.data.agent), ts=last.ts))
        run.clear()

    for item in batch:
        if type(item.data) is TextDelta:
            if run and run[-1].data.agent != item.data.agent:
                close_run()
            run.append(item)
        else:
            close_run()
            out.append(item)
    close_run()
    return out


async def stream_run(dialect: Dialect, subscription: Any, *, ping_interval: float,
                     on_abandon: Callable[[], Awaitable[None]] | None = None,
                     hold: float = 0.0) -> AsyncIterator[list[Frame]]:
    """A run's frames in ``dialect``, one list per batch of events, until the run ends.

    Pings are periodic (every ``ping_interval`` seconds while the stream is open, whether or not
    events flowed). ``subscription`` starts after the dialect's ``after_seq``. If the reader goes
    away before the end (the generator is closed or cancelled), ``on_abandon`` runs detached,
    e.g. to cancel the run for a dialect with ``cancel_on_disconnect``. With ``hold`` (seconds),
    the opening frames and the first batch (a new run's ``agent.start``) are kept back until a
    later event arrives, the run ends or ``hold`` runs out, then yielded as one list (one write).
    """
    loop = asyncio.get_running_loop()
    ended = False
    if hasattr(subscription, "merge_deltas"):
        subscription.merge_deltas = True  # the batch is coalesced below anyway
    try:
        # The frames go out as the events come, without waiting for the run's start rows to be
        # committed (the group-commit writer lands them beside the provider call): what a client
        # does next with the run's id in this process waits for them (executor.wait_recorded);
        # every database write of the run itself comes after them. With ``hold``, the opening
        # frames and the first batch wait for the next one (see the docstring).
        held: list[Frame] | None = None  # with ``hold``: the frames kept back until the run's first output
        hold_until = loop.time() + hold
        opening = dialect.opening()
        if hold > 0:
            held = list(opening)
        elif opening:
            yield opening
        first_seq: int | None = None
        next_ping = loop.time() + ping_interval
        while not dialect.finished:
            try:
                batch = await subscription.next(next_ping if held is None else min(next_ping, hold_until))
            except TimeoutError:
                batch = []
            if batch is None:
                break
            frames: list[Frame] = []
            if loop.time() >= next_ping:
                frames.extend(dialect.ping())
                next_ping = max(next_ping + ping_interval, loop.time() + ping_interval / 2)
            for event in coalesce(batch):
                frames.extend(dialect.translate(event))
                dialect.last_seq = event.seq
                if dialect.finished:
                    break
            if held is not None:
                if first_seq is None and batch:
                    first_seq = batch[0].seq
                held.extend(frames)
                if not (dialect.finished or loop.time() >= hold_until
                        or (first_seq is not None and dialect.last_seq != first_seq)):
                    continue
                frames, held = held, None
            if frames:
                yield frames
        if held:
            yield held
        ended = True
        closing = dialect.closing()
        if closing:
            yield closing
    finally:
        if not ended and on_abandon is not None:
            detach(on_abandon())
        await _close_quietly(subscription)


async def _close_quietly(subscription: Any) -> None:
    try:
        await subscription.close()
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the stream is closing anyway
        pass
