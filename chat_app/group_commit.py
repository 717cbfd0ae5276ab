"""Group commit: the runs' writes, from every stream of this process, in one transaction a batch.

A run writes three times on its way (its start: conversation, run, user message and
``agent.start``; its event batches; its end), and a server streams many runs at once. Each write
as its own transaction costs a thread hop, a ``BEGIN``, a ``COMMIT`` (a WAL append on SQLite, a
round trip and a WAL flush on PostgreSQL) and GIL hand-offs; under fifty concurrent starts those
dominated the server's CPU per stream (profile: the pool threads' transactions, ~40% of the GIL
time, and three times the bare relay's kernel time in futex and file-lock calls).

:class:`GroupCommitWriter` is one thread with its own database connection. The event loop hands
it jobs (:meth:`GroupCommitWriter.write`, never blocking); the thread takes everything queued,
runs it in ONE transaction and commits once, then resolves the jobs' futures with one call into
each loop. Each job runs inside its own savepoint, so a job that fails (or asks for a rollback,
as a run's end does when another process ended the run first) is undone alone and the batch
commits the rest. Adjacent jobs with the same ``merge`` function run as one call first (one
``executemany`` for many runs' events, one multi-row insert for many runs' starts); if that call
fails they run again one by one, each in its own savepoint, so one bad job never fails another.

Jobs of one run are submitted in order from one loop and the thread runs them first in, first
out, so a run's start always lands before its events and its end. A job that needs what an
earlier job wrote awaits that job's future before submitting itself.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from django.db import connection, connections, transaction

from core.blocking import refuse_on_event_loop

logger = logging.getLogger("orchestrator.runs")

# PostgreSQL: how long one job of a batch may wait for a row lock before it fails (alone).
LOCK_TIMEOUT = 5.0


@dataclass(eq=False)
class _Job:
    func: Callable[..., Any]
    args: tuple
    merge: Callable[[list[tuple]], Any] | None
    loop: asyncio.AbstractEventLoop | None
    future: Any  # asyncio.Future (loop set) or a threading-based _SyncResult
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class _SyncResult:
    done: threading.Event = field(default_factory=threading.Event)


class GroupCommitWriter:
    """One writer thread; see the module docstring."""

    def __init__(self, name: str = "orchestrator-writer"):
        self._name = name
        # A C-level queue: put() from the loop is cheap, and get() blocks the idle thread.
        self._queue: queue.SimpleQueue[_Job | Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.batches = 0  # for tests and the benchmark's curiosity: how many transactions ran
        self.jobs = 0

    # --- submitting --------------------------------------------------------------------------
    def write(self, func: Callable[..., Any], *args: Any,
              merge: Callable[[list[tuple]], Any] | None = None) -> asyncio.Future:
        """Queue ``func(*args)`` for the next batch; the future resolves after its commit.

        ``merge``, when given, may run this job together with adjacent jobs that have the same
        ``merge``: it gets the list of their ``args`` and does all their work at once (its
        result is ignored; each merged job's result is None).
        """
        loop = asyncio.get_running_loop()
        job = _Job(func, args, merge, loop, loop.create_future())
        self._put(job)
        return job.future

    def write_later(self, delay: float, func: Callable[..., Any], *args: Any,
                    merge: Callable[[list[tuple]], Any] | None = None,
                    busy: Callable[[], bool] | None = None, latest: float = 0.0) -> "DeferredWrite":
        """:meth:`write`, handed to the thread ``delay`` seconds from now — or, with 0, after the
        callbacks already scheduled on the loop — unless :meth:`DeferredWrite.now` comes first.

        For a new run's start rows: the woken thread takes the GIL, so written at once they
        delayed the run's own provider request (traced: ~2 ms) and then the reading of its first
        response (~0.6 ms at one stream; under fifty starts at once, ~14% on the median first
        delta). Whoever needs the rows written calls ``now()``.

        With ``busy``, the write waits on past ``delay`` while ``busy()`` is true, checked every
        :data:`BUSY_RECHECK` seconds, but never past ``latest`` seconds: a burst of new runs is
        recorded after their first outputs, not among them.
        """
        loop = asyncio.get_running_loop()
        return DeferredWrite(self, _Job(func, args, merge, loop, loop.create_future()), loop, delay,
                             busy=busy, latest=latest)

    def write_sync(self, func: Callable[..., Any], *args: Any) -> Any:
        """For a caller on a thread (not the event loop): queue the job and wait for its commit."""
        job = _Job(func, args, None, None, _SyncResult())
        self._put(job)
        job.future.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def control(self, func: Callable[[], None], timeout: float = 10.0) -> None:
        """Run ``func`` on the writer thread outside any transaction (e.g. close its connection)."""
        done = threading.Event()
        errors: list[BaseException] = []

        def call() -> None:
            try:
                func()
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                errors.append(exc)
            finally:
                done.set()

        if self._thread is None:
            return
        self._put(call)
        if not done.wait(timeout):
            raise TimeoutError("the group-commit writer did not answer")
        if errors:
            raise errors[0]

    def _put(self, item: Any) -> None:
        if self._thread is None:
            self._start()
        self._queue.put(item)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()
                self._thread = thread

    # --- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        from .eventlog import _check_kept, _leave_idle

        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            item = get()  # wait for work, then take everything queued behind it
            batch: list[_Job] = []
            while True:
                if isinstance(item, _Job):
                    batch.append(item)
                else:
                    if batch:  # a control call waits for the jobs queued before it
                        self._commit(batch, _check_kept, _leave_idle)
                        batch = []
                    item()
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._commit(batch, _check_kept, _leave_idle)
            item = batch = None  # idle: hold nothing of the last batch (its rows, its closures)

    def _commit(self, batch: list[_Job], check_kept: Callable, leave_idle: Callable) -> None:
        server = connection.vendor != "sqlite"
        try:
            if server and connection.connection is not None:
                check_kept(server)
            with transaction.atomic():
                if connection.vendor == "postgresql":
                    # One job stuck behind a row lock must not hold every run's writes: it fails
                    # alone (its savepoint) after this long, the others commit.
                    with connection.cursor() as cursor:
                        cursor.execute(f"SET LOCAL lock_timeout = '{int(LOCK_TIMEOUT * 1000)}ms'")
                for group in _groups(batch):
                    _run_group(group)
        except BaseException as exc:  # noqa: BLE001 - the commit (or BEGIN) failed: every job did
            logger.exception("a group commit of %d jobs failed", len(batch))
            for job in batch:
                if job.error is None:
                    job.error = exc
            if connection.connection is not None and (connection.in_atomic_block or not connection.is_usable()):
                connection.close()
        finally:
            if server:
                leave_idle()
        self.batches += 1
        self.jobs += len(batch)
        _resolve(batch)


# How often a deferred write waiting for a quiet moment (``busy``) looks again.
BUSY_RECHECK = 0.025


class DeferredWrite:
    """A write waiting to be handed to the writer thread (see :meth:`GroupCommitWriter.write_later`)."""

    def __init__(self, writer: GroupCommitWriter, job: _Job, loop: asyncio.AbstractEventLoop, delay: float, *,
                 busy: Callable[[], bool] | None = None, latest: float = 0.0):
        self.future: asyncio.Future = job.future
        self._writer, self._job, self._loop = writer, job, loop
        self._busy = busy
        self._latest = loop.time() + max(delay, latest)
        self._handle: asyncio.Handle | None = (loop.call_later(delay, self._due) if delay > 0
                                               else loop.call_soon(self._due))

    def _due(self) -> None:
        if self._handle is None:
            return
        wait = self._latest - self._loop.time()
        if self._busy is not None and wait > 0 and self._busy():
            self._handle = self._loop.call_later(min(BUSY_RECHECK, wait), self._due)
            return
        self.now()

    def now(self) -> None:
        """Hand the write to the thread at once, if it is still waiting (on the loop's thread)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._writer._put(self._job)

    def now_threadsafe(self) -> None:
        """:meth:`now`, from any thread."""
        try:
            self._loop.call_soon_threadsafe(self.now)
        except RuntimeError:  # the loop is closed: its timer will never fire; hand it over here
            if self._handle is not None:
                self._handle = None
                self._writer._put(self._job)


def _groups(batch: list[_Job]) -> list[list[_Job]]:
    groups: list[list[_Job]] = []
    for job in batch:
        if groups and job.merge is not None and groups[-1][0].merge is job.merge:
            groups[-1].append(job)
        else:
            groups.append([job])
    return groups


def _run_group(group: list[_Job]) -> None:
    if len(group) > 1:
        try:
            with transaction.atomic():
                group[0].merge([job.args for job in group])
            return
        except Exception:  # noqa: BLE001 - find the job that fails: one by one below
            logger.warning("a merged write of %d jobs failed; running them one by one", len(group), exc_info=True)
    for job in group:
        try:
            with transaction.atomic():
                job.result = job.func(*job.args)
        except Exception as exc:  # noqa: BLE001 - this job's failure, handed to its caller
            job.error = exc


def _resolve(batch: list[_Job]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
    for job in batch:
        if job.loop is None:
            job.future.done.set()
        else:
            by_loop.setdefault(job.loop, []).append(job)
    for loop, jobs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_results, jobs)
        except RuntimeError:  # the loop is closed (a test's loop, a stopped server): nobody waits
            pass


def _set_results(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.future.done():  # the waiter was cancelled; the write itself happened (or failed)
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)


WRITER = GroupCommitWriter()

_INSERTS: dict[tuple[type, str], tuple[str, list]] = {}


def insert_rows(model: type, objs: list[Any]) -> None:
    """INSERT model instances with one cached statement (call inside a transaction).

    What ``bulk_create`` does for models with client-side primary keys (here: UUIDs), without
    compiling the SQL again for every call: each field's ``pre_save`` (``auto_now``) and
    ``get_db_prep_save`` (the backend's value adaptation) run as Django runs them. No signals, as
    with ``bulk_create``; the models written here have none.
    """
    if not objs:
        return
    key = (model, connection.vendor)
    cached = _INSERTS.get(key)
    if cached is None:
        fields = [f for f in model._meta.local_concrete_fields if f.column]
        qn = connection.ops.quote_name
        sql = (f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
               f"VALUES ({', '.join(['%s'] * len(fields))})")
        cached = _INSERTS.setdefault(key, (sql, fields))
    sql, fields = cached
    rows = [[f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields] for obj in objs]
    with connection.cursor() as cursor:
        if len(rows) == 1:
            cursor.execute(sql, rows[0])
        else:
            cursor.executemany(sql, rows)
    for obj in objs:  # as after save(): the instance is in the database now
        obj._state.adding = False
        obj._state.db = connection.alias


def close_writer_connection(timeout: float = 10.0) -> None:
    """Close the writer thread's database connection (tests, before dropping a database)."""
    WRITER.control(connections.close_all, timeout=timeout)


_UPDATES: dict[tuple, tuple[str, list]] = {}


def update_row(model: type, pk: Any, values: dict[str, Any], *, only_if_in: tuple[str, tuple] | None = None) -> int:
    """``UPDATE model SET <values> WHERE pk = pk [AND field IN (...)]`` with a cached statement.

    The value adaptation is the field's ``get_db_prep_save``, as ``QuerySet.update`` does; the
    statement is compiled once per shape. Returns the number of rows updated (0 or 1).
    """
    names = tuple(values)
    key = (model, connection.vendor, names, only_if_in[0] if only_if_in else None, len(only_if_in[1]) if only_if_in else 0)
    cached = _UPDATES.get(key)
    if cached is None:
        meta, qn = model._meta, connection.ops.quote_name
        fields = [meta.get_field(name) for name in names]
        sql = (f"UPDATE {qn(meta.db_table)} SET {', '.join(f'{qn(f.column)} = %s' for f in fields)} "
               f"WHERE {qn(meta.pk.column)} = %s")
        if only_if_in:
            sql += f" AND {qn(meta.get_field(only_if_in[0]).column)} IN ({', '.join(['%s'] * len(only_if_in[1]))})"
        cached = _UPDATES.setdefault(key, (sql, fields))
    sql, fields = cached
    meta = model._meta
    params = [f.get_db_prep_save(values[f.name], connection) for f in fields]
    params.append(meta.pk.get_db_prep_value(pk, connection))
    if only_if_in:
        field = meta.get_field(only_if_in[0])
        params.extend(field.get_db_prep_value(v, connection) for v in only_if_in[1])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


# --- writes that reads must wait for ----------------------------------------------------------
# A run's start rows are written beside its provider call, and its stream goes out meanwhile; a
# read in this process of what the stream announced (the run, its conversation) waits for them.
_PENDING: dict[str, tuple[threading.Event, DeferredWrite]] = {}


def hold_reads_until(keys: tuple[str, ...], write: DeferredWrite) -> None:
    """Reads of ``keys`` (ids) in this process wait (:func:`wait_written`) until ``write`` is
    committed (or failed); a read asks for it to be handed to the writer at once."""
    done = threading.Event()
    entry = (done, write)
    for key in keys:
        _PENDING[key] = entry

    def release(_: Any) -> None:
        done.set()
        for key in keys:
            if _PENDING.get(key) is entry:
                del _PENDING[key]

    write.future.add_done_callback(release)


def wait_written(key: Any, timeout: float = 10.0) -> None:
    """Until a pending write of ``key`` (see :func:`hold_reads_until`) is done; at once if none.

    On the event loop it raises ``SynchronousOnlyOperation`` (as the ORM would) instead of
    blocking it; ``AsyncApiView.burst`` then runs the read in a thread.
    """
    entry = _PENDING.get(str(key))
    if entry is None or entry[0].is_set():
        return
    # The loop itself releases ``done``: waiting there would wait on itself.
    refuse_on_event_loop("This read waits for a pending write; call it from a thread.", escape_hatch=False)
    done, write = entry
    write.now_threadsafe()
    done.wait(timeout)
