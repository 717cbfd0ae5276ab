"""A run's event log: the live copy in memory, its batched recording, and subscriptions to it.

A live run's events go to subscribers first (memory, no disk wait) and to the database in
batches: on a short timer (``RUN_EVENT_FLUSH_INTERVAL``) and at once for every state change
(``durable`` events). A batch is one statement of pre-encoded rows (``executemany`` on SQLite,
``COPY`` on PostgreSQL), written by the group-commit writer (``chat_app/group_commit.py``) in its
next transaction together with every other run's writes, so no ORM instance is built per delta,
the event loop never waits on the disk, and no stream holds a connection. After each batch the run's ``events`` group is rung on the channel layer, which
wakes subscribers in other processes (they read the database; a timer re-read is only the
safety net for a lost ring).

Subscriptions hand out *batches*: everything that arrived since the subscriber last looked, so a
slow reader catches up in one step and dialects can coalesce consecutive deltas.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from django.conf import settings
from django.db import connection, connections, transaction

from core.doorbell import RunDoorbell, ring
from core.events import RecordedEvent, RunEventBase, TextDelta
from core.scheduling import wake_first

from .group_commit import WRITER
from .models import Run, RunEvent

logger = logging.getLogger("orchestrator.runs")

# A reader in another process re-reads the database this often even without a ring.
SAFETY_NET_SECONDS = 5.0


# Blocking database work runs here: a small, fixed pool whose threads keep their connection.
_DB_POOL = ThreadPoolExecutor(max_workers=int(getattr(settings, "DB_THREADS", 8)), thread_name_prefix="orchestrator-db")
# A pool thread's connection idle longer than this is checked (a round trip) before it is used.
HEALTH_CHECK_AFTER = 10.0
_local = threading.local()


def _work(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    server = connection.vendor != "sqlite"
    if server and connection.connection is not None:
        _check_kept(server)
    try:
        return func(*args, **kwargs)
    except Exception:
        if connection.connection is not None and (connection.in_atomic_block or not connection.is_usable()):
            connection.close()
        raise
    finally:
        if server:
            _leave_idle()


def _check_kept(server: bool) -> None:
    # Django's own close_if_unusable_or_obsolete would close it: CONN_MAX_AGE is 0 for request
    # threads. A pool thread keeps its connection; one idle for a while (a database restart, a
    # server-side idle timeout) is checked before use instead of failing the caller's query.
    if time.monotonic() - getattr(_local, "used", 0.0) > HEALTH_CHECK_AFTER and not connection.is_usable():
        connection.close()


def _leave_idle() -> None:
    """After every call: the kept connection is in autocommit with no transaction open.

    Django's atomic blocks always end (commit or rollback) before the call returns, and every
    statement outside one commits on its own; this is the check that no code path left a
    session "idle in transaction" (holding locks a TRUNCATE or a migration would wait on).
    """
    _local.used = time.monotonic()
    raw = connection.connection
    if raw is None:
        return
    if connection.in_atomic_block or not connection.get_autocommit() or _in_transaction(raw):
        logger.warning("a database-pool call left a transaction open; closing its connection", stack_info=True)
        connection.close()
    else:
        connection.close_at = None  # kept: see _check_kept


def _in_transaction(raw: Any) -> bool:
    try:
        from psycopg.pq import TransactionStatus
    except ImportError:  # pragma: no cover - another server backend: trust Django's bookkeeping
        return False
    return raw.info.transaction_status != TransactionStatus.IDLE


def in_thread(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run blocking database work on the database pool, not on asgiref's one shared ORM thread,
    so concurrent requests do not queue behind each other.

    The pool is small and fixed (``DB_THREADS``) and each of its threads keeps its connection
    between calls: the thread pool *is* the connection pool. On SQLite opening and closing one
    per call would cost more than the work (closing SQLite's last WAL connection checkpoints the
    log); on PostgreSQL a new connection per call costs a server process fork and an
    authentication round trip, more than most calls. A kept PostgreSQL connection is in
    autocommit and is checked after every call to hold no open transaction (else it is closed),
    and before use when it was idle for a while. No stream, idle or not, holds one. A connection
    left unusable by an error, or inside a broken transaction, is closed. Context variables are
    not carried over (Django's connections are per thread; nothing here reads request context),
    which keeps a call cheap.
    """

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(_DB_POOL, _work, func, args, kwargs)

    return call


def close_pool_connections(timeout: float = 10.0) -> None:
    """Close the connection of every database-pool thread (tests, before dropping a database)."""
    workers = _DB_POOL._max_workers
    barrier = threading.Barrier(workers, timeout=timeout)

    def close() -> None:
        try:
            connections.close_all()
        finally:
            try:
                barrier.wait()  # each task holds its thread until all have one: one task per thread
            except threading.BrokenBarrierError:
                pass

    for future in [_DB_POOL.submit(close) for _ in range(workers)]:
        future.result(timeout=timeout + 1)
    from .group_commit import close_writer_connection

    close_writer_connection(timeout)


def _split_time(ts: float) -> tuple[float, int]:
    """(whole seconds, microseconds) exactly as ``datetime.fromtimestamp`` splits a timestamp:
    the fraction scaled to microseconds, rounded half to even, a full second carried over."""
    fraction, whole = math.modf(ts)
    micro = round(fraction * 1e6)
    if micro >= 1_000_000:
        return whole + 1.0, micro - 1_000_000
    if micro < 0:
        return whole - 1.0, micro + 1_000_000
    return whole, micro


_modf = math.modf


def _second_text(whole: float) -> str:
    return datetime.fromtimestamp(whole, tz=timezone.utc).replace(tzinfo=None).isoformat(" ")


# The text of the last whole second formatted: a batch's rows share their seconds, so a row
# costs a split and a string, not a datetime and its timezone conversions.
_SECOND: tuple[float, str] = (math.nan, "")


def _second_and_micro(ts: float) -> tuple[str, int]:
    """(the naive UTC ISO text of ``ts``'s whole second, its microseconds), as
    ``datetime.fromtimestamp`` splits it; the second's text is cached."""
    global _SECOND
    fraction, whole = _modf(ts)
    micro = round(fraction * 1e6)
    if not 0 <= micro < 1_000_000:
        whole, micro = _split_time(ts)
    second, text = _SECOND
    if second != whole:
        text = _second_text(whole)
        _SECOND = (whole, text)
    return text, micro


def _sqlite_time(ts: float) -> str:
    # What Django's SQLite backend stores for an aware datetime: naive UTC ISO text with a space,
    # microseconds only when not zero (datetime.isoformat); without the per-row conversions of
    # adapt_datetimefield_value (thousands of rows a second).
    text, micro = _second_and_micro(ts)
    return f"{text}.{micro:06d}" if micro else text


def _aware_time(ts: float) -> str:
    # ``datetime.fromtimestamp(ts, tz=timezone.utc)`` as the text PostgreSQL reads for a
    # timestamptz (COPY's text format takes it as is, parsed by the server, not in Python).
    text, micro = _second_and_micro(ts)
    return f"{text}.{micro:06d}+00:00"


_SQL: dict[str, str] = {}


# A live run keeps each text delta (thousands a run) as a plain ``(seq, ts, text, agent)``
# tuple, not as its RecordedEvent and TextDelta: a tuple of strings and numbers is dropped from
# the garbage collector's lists at its first collection, while two objects per delta, kept for
# the run's life and its linger, were promoted to the oldest generation and triggered its full
# collections every few long runs (5-6 us a delta, measured with gc.callbacks; none in the bare
# relay). Readers get RecordedEvents back (see _readable); the recorder writes the tuple's row
# directly.
_DELTA = TextDelta.event


def _compact(recorded: RecordedEvent) -> "RecordedEvent | tuple":
    data = recorded.data
    if type(data) is TextDelta and recorded._payload is None and type(data.text) is str and type(data.agent) is str:
        return (recorded.seq, recorded.ts, data.text, data.agent)
    return recorded


def _expand(run_id: str, entry: "RecordedEvent | tuple") -> RecordedEvent:
    if type(entry) is not tuple:
        return entry
    seq, ts, text, agent = entry
    return RecordedEvent(run_id, seq, TextDelta(text, agent), ts)


def _readable(run_id: str, batch: list, *, merge: bool) -> list[RecordedEvent]:
    """A batch of a live run's entries as RecordedEvents; with ``merge``, consecutive compact
    deltas of one agent as one (its seq and time the last one's, as coalesce() merges them)."""
    if not merge:
        return [_expand(run_id, entry) if type(entry) is tuple else entry for entry in batch]
    out: list[RecordedEvent] = []
    texts: list[str] = []
    last: tuple = ()
    for entry in batch:
        if type(entry) is tuple:
            if texts and entry[3] != last[3]:
                out.append(_merged(run_id, last, texts))
                texts = []
            texts.append(entry[2])
            last = entry
            continue
        if texts:
            out.append(_merged(run_id, last, texts))
            texts = []
        out.append(entry)
    if texts:
        out.append(_merged(run_id, last, texts))
    return out


def _merged(run_id: str, last: tuple, texts: list[str]) -> RecordedEvent:
    seq, ts, _, agent = last
    return RecordedEvent(run_id, seq, TextDelta("".join(texts), agent), ts)


def insert_events(run_id: str, events: Iterable["RecordedEvent | tuple"]) -> None:
    """One statement for a batch of events (call inside a transaction, in a worker thread).

    PostgreSQL gets one ``COPY … FROM STDIN`` on psycopg's own cursor (rows formatted in C;
    Django's cursor binds parameters client-side, quoting every array element in Python, which
    cost more than the rest of a 5,000-delta stream); SQLite, in process, one ``executemany``.
    ``events`` are RecordedEvents or a live run's compact deltas (see :func:`_compact`).
    """
    events = list(events)
    if not events:
        return
    run_key = RunEvent._meta.get_field("run").get_db_prep_value(run_id, connection)
    columns = "(run_id, seq, event, at, payload)"
    if connection.vendor == "postgresql":
        run_key = str(run_key)  # COPY text takes a uuid's text; psycopg's UUID dumper is Python, per row
        sql = _SQL.get("copy") or _SQL.setdefault(
            "copy", f"COPY {connection.ops.quote_name(RunEvent._meta.db_table)} {columns} FROM STDIN")
        with connection.connection.cursor() as cursor, cursor.copy(sql) as copy:
            copy.write(_copy_text(run_key, events))
        return
    sql = _SQL.get("insert") or _SQL.setdefault(
        "insert", f"INSERT INTO {connection.ops.quote_name(RunEvent._meta.db_table)} {columns} VALUES (%s, %s, %s, %s, %s)")
    with connection.cursor() as cursor:
        cursor.executemany(sql, list(_rows(run_key, events, _sqlite_time)))


def _rows(run_key: Any, events: list, time_text: Callable[[float], str]) -> Iterable[tuple]:
    json_of = TextDelta.json_of
    for e in events:
        if type(e) is tuple:
            seq, ts, text, agent = e
            yield run_key, seq, _DELTA, time_text(ts), json_of(text, agent)
        else:
            yield run_key, e.seq, e.event, time_text(e.ts), e.payload_json


# COPY's text format: a backslash and the control characters it names are escaped (what
# psycopg's write_row does to every text value).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v",
                               "\f": "\\f", "\r": "\\r"})


def _copy_text(run_key: str, events: list) -> str:
    """The batch as COPY text, one line per row, built in one pass (psycopg's write_row costs a
    Python call and a dumper lookup per value). The payload is JSON from the one encoder: it
    holds no raw control character (the encoder escapes them in strings and writes no
    whitespace), so of COPY's escapes only the backslash's applies."""
    json_of = TextDelta.json_of
    lines = []
    for e in events:
        if type(e) is tuple:
            seq, ts, text, agent = e
            name, at, payload = _DELTA, _aware_time(ts), json_of(text, agent)
        else:
            seq, name, at, payload = e.seq, e.event.translate(_COPY_ESCAPES), _aware_time(e.ts), e.payload_json
        payload = payload.replace("\\", "\\\\")
        lines.append(f"{run_key}\t{seq}\t{name}\t{at}\t{payload}\n")
    return "".join(lines)


def _write_batch(run_id: str, events: list[RecordedEvent]) -> None:
    insert_events(run_id, events)


def _write_batches(batches: list[tuple[str, list[RecordedEvent]]]) -> None:
    """Several runs' batches in one group commit (see ``chat_app.group_commit``)."""
    for run_id, events in batches:
        insert_events(run_id, events)


def _noop() -> None:
    pass


class LiveRun:
    """One executing run in this process: its ordered events and who is waiting for more."""

    def __init__(self, run_id: str, *, first: RecordedEvent | None = None, next_seq: int = 1):
        self.run_id = str(run_id)
        self.events: list[RecordedEvent | tuple] = []  # deltas kept compact: see publish
        self.first_seq = first.seq if first else next_seq
        self._next_seq = self.first_seq
        self.done = False
        self.task: asyncio.Task | None = None
        # Cancelling the task is only safe while the engine runs: before that its setup would die
        # without recording an end; after the engine returned, the run finishes as it is.
        self.cancellable = False
        self.cancel_requested = False
        self._task_cancelled = False
        self._waiter: asyncio.Event | None = None
        self._pending: list[RecordedEvent] = []
        self._flush_lock = asyncio.Lock()
        self._flush_handle: asyncio.TimerHandle | None = None
        # The run's own commit, when the executor runs it beside the engine's start (see
        # await_record): nothing is written, and no subscriber reads, before it lands.
        self.recorded: asyncio.Future | None = None
        self._record_now: Callable[[], None] = _noop
        self.record_error: BaseException | None = None
        self.on_output: Callable[[], None] | None = None  # called once, at the first publish
        self.has_output = False  # anything published after the first event (see wait_output)
        if first is not None:
            self.events.append(first)  # recorded with the run itself
            self._next_seq = first.seq + 1

    # --- the run's own commit ------------------------------------------------------------------
    def await_record(self, write: Any) -> None:
        """The run's rows are ``write`` (a :class:`~chat_app.group_commit.DeferredWrite`):
        nothing of the run is written, and no subscriber reads, before it lands; see
        :meth:`wait_recorded`."""
        self._record_now = write.now
        self.recorded = write.future
        self.recorded.add_done_callback(self._recorded)

    def _recorded(self, future: asyncio.Future) -> None:
        error = asyncio.CancelledError() if future.cancelled() else future.exception()
        if error is not None:
            self.record_error = error
            logger.error("recording run %s failed; ending it", self.run_id, exc_info=error)
            self.request_cancel()
        self._wake()

    async def wait_recorded(self) -> bool:
        """Until the run's rows are committed; False when that failed (the run exists nowhere)."""
        if self.recorded is not None and not self.recorded.done():
            self._record_now()  # someone waits: no more deferring
            await asyncio.wait({self.recorded})  # a cancelled waiter leaves the commit running
        return self.record_error is None

    # --- producing ---------------------------------------------------------------------------
    def make(self, data: RunEventBase) -> RecordedEvent:
        """The next event in the log, not yet published (see :meth:`publish`)."""
        recorded = RecordedEvent(self.run_id, self._next_seq, data)
        self._next_seq += 1
        return recorded

    def publish(self, recorded: RecordedEvent, *, persist: bool = True) -> None:
        entry = _compact(recorded)
        self.events.append(entry)
        if not self.has_output:  # the run's first event after its start
            self.has_output = True
            if self.on_output is not None:
                hook, self.on_output = self.on_output, None
                hook()
        if persist:
            self._pending.append(entry)
            if self._flush_handle is None and not recorded.data.durable:
                loop = asyncio.get_running_loop()
                self._flush_handle = loop.call_later(float(settings.RUN_EVENT_FLUSH_INTERVAL), self._flush_soon)
        self._wake()

    async def record(self, data: RunEventBase) -> RecordedEvent:
        """Publish an event now; a state change is also on disk before this returns."""
        recorded = self.make(data)
        self.publish(recorded)
        if data.durable:
            await self.flush()
        return recorded

    def _flush_soon(self) -> None:
        self._flush_handle = None
        task = asyncio.ensure_future(self.flush())
        task.add_done_callback(_log_flush_failure)

    async def flush(self) -> None:
        async with self._flush_lock:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
            if not self._pending:
                return
            if not await self.wait_recorded():
                self._pending = []  # the run has no rows to add events to; subscribers had them
                return
            batch, self._pending = self._pending, []
            await WRITER.write(_write_batch, self.run_id, batch, merge=_write_batches)
        await ring(self.run_id, "events")

    async def finish(self, final: list[RunEventBase], commit: Callable[[list[RecordedEvent]], bool]) -> bool:
        """Record the run's last events and its final state in ONE transaction, then publish them.

        One group-commit job writes the events still pending, then — in a savepoint — the final
        events and ``commit(events)``, which returns False when the run already ended elsewhere:
        that rolls the final part back (the events before it stay) and publishes nothing.
        """
        recorded = [self.make(data) for data in final]

        def write(batch: list[RecordedEvent]) -> bool:
            insert_events(self.run_id, batch)
            with transaction.atomic():
                insert_events(self.run_id, recorded)
                if not commit(recorded):
                    transaction.set_rollback(True)
                    return False
            return True

        async with self._flush_lock:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
            batch, self._pending = self._pending, []
            if not await self.wait_recorded():
                ok = False
            else:
                ok = await WRITER.write(write, batch)
        if ok:
            for item in recorded:
                self.publish(item, persist=False)
            await ring(self.run_id, "events")
        self.done = True
        self._wake()
        return ok

    def retire(self) -> None:
        """The run has ended: keep only what its linger serves (events, status, late readers).

        A finished run stays readable here for ``LINGER_SECONDS``; what it no longer needs — its
        task (and with it the task's context), the hand-off of its start rows (the rows
        themselves, as model instances) — would otherwise stay alive as long, be promoted to the
        collector's oldest generation and make every full collection walk them (under fifty
        concurrent streams, some sixty objects a run; py-spy and ``gc.callbacks`` counted full
        collections growing from 5 to 60 ms as a benchmark went on).
        """
        self.task = None
        self._record_now = _noop
        if self.recorded is not None and self.recorded.done():
            self.recorded = None  # its outcome stays in record_error

    def finish_unrecorded(self) -> None:
        self.done = True
        self._wake()

    def request_cancel(self) -> None:
        """Cancel the run's task, once: a second cancel (the keeper, a ring and the caller can all
        ask) would interrupt the clean-up the first one started (e.g. expiring a confirmation)."""
        self.cancel_requested = True
        if self.cancellable and not self._task_cancelled and self.task is not None and not self.task.done():
            self._task_cancelled = True
            self.task.cancel()

    def _wake(self) -> None:
        """Wake the readers waiting for a change; they run next, ahead of other ready work
        (:func:`core.scheduling.wake_first`): a stream writes what its run published in the
        same pass of the loop."""
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            wake_first(waiter)

    # --- consuming ---------------------------------------------------------------------------
    async def wait_output(self) -> None:
        """Until the run publishes anything after its first event (``agent.start``), or ends."""
        while not (self.has_output or self.done):
            await self.wait_changed()

    async def wait_changed(self) -> None:
        if self._waiter is None:
            self._waiter = asyncio.Event()
        await self._waiter.wait()


def _log_flush_failure(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("event flush failed", exc_info=task.exception())


class Subscription:
    """Batches of a run's events after ``after_seq``, in order, until the run's end."""

    # Set by a reader that merges consecutive text deltas of one agent anyway (stream_run
    # coalesces them into one frame): a live run may then hand such a run of deltas as the one
    # event coalesce() would make of it, without building an event per delta first.
    merge_deltas: bool = False

    async def next(self, deadline: float | None = None) -> list[RecordedEvent] | None:
        """The next batch (never empty), or None when the run ended and everything was read.

        Raises:
            TimeoutError: nothing new before ``deadline`` (the loop's clock).
        """
        raise NotImplementedError

    async def close(self) -> None:
        return None

    async def ready(self) -> None:
        """Until the run can be read (its own commit landed, for a run started with it deferred)."""
        return None

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        try:
            while (batch := await self.next()) is not None:
                for item in batch:
                    yield item
        finally:
            await self.close()


class LiveSubscription(Subscription):
    def __init__(self, live: LiveRun, after_seq: int = 0):
        self.live = live
        self.index = max(0, after_seq - live.first_seq + 1)

    async def ready(self) -> None:
        await self.live.wait_recorded()

    async def next(self, deadline: float | None = None) -> list[RecordedEvent] | None:
        live = self.live
        while True:
            if self.index < len(live.events):
                batch = live.events[self.index:]
                self.index = len(live.events)
                return _readable(live.run_id, batch, merge=self.merge_deltas)
            if live.done:
                return None
            if deadline is None:
                await live.wait_changed()
            else:
                async with asyncio.timeout_at(deadline):
                    await live.wait_changed()


def _read_after(run_id: str, after_seq: int) -> tuple[str | None, list[RecordedEvent]]:
    status = Run.objects.filter(id=run_id).values_list("status", flat=True).first()
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq").values_list(
        "seq", "event", "at", "payload")
    return status, [RecordedEvent.from_payload(run_id, seq, event, payload, ts=at.timestamp())
                    for seq, event, at, payload in rows]


class StoredSubscription(Subscription):
    """A run executing in another process (or already finished): read from the database, woken
    by the run's ring after each recorded batch; a timer re-read covers a lost ring."""

    def __init__(self, run_id: str, after_seq: int = 0, *, find_live: Callable[[str], LiveRun | None]):
        self.run_id = str(run_id)
        self.last = after_seq
        self._find_live = find_live
        self._doorbell: RunDoorbell | None = None
        self._ended = False
        self._local: LiveSubscription | None = None

    async def next(self, deadline: float | None = None) -> list[RecordedEvent] | None:
        loop = asyncio.get_running_loop()
        while True:
            if self._local is not None:
                return await self._local.next(deadline)
            if self._ended:
                return None
            if self._doorbell is None:
                # Listen before reading, so a batch committed between the read and the wait rings.
                self._doorbell = RunDoorbell(self.run_id, events=True)
                await self._doorbell.start()
            status, batch = await in_thread(_read_after)(self.run_id, self.last)
            if batch:
                self.last = batch[-1].seq
                if any(item.event == "agent.end" for item in batch):
                    self._ended = True
                return batch
            if status is None or status in Run.TERMINAL:
                # The final status and agent.end commit together: terminal and nothing after
                # ``last`` means there is nothing more to read.
                return None
            live = self._find_live(self.run_id)
            if live is not None:  # it started executing here meanwhile
                self._local = LiveSubscription(live, self.last)
                self._local.merge_deltas = self.merge_deltas
                continue
            wait = SAFETY_NET_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    raise TimeoutError
            await self._doorbell.wait("events", wait)

    async def close(self) -> None:
        if self._doorbell is not None:
            await self._doorbell.stop()
            self._doorbell = None
