"""The group-commit writer: one transaction a batch, each job isolated by its own savepoint."""
from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError, transaction

from chat_app import services
from chat_app.api.agent_chat import AgentChatInput, AiSdkChatOptionsInput
from chat_app.api.serializers import ConversationCreateInput, fast_validated_data
from chat_app.group_commit import GroupCommitWriter
from chat_app.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def writer():
    """A writer of the test's own; its thread's connection is closed afterwards (PostgreSQL
    refuses to drop a test database that a connection still uses)."""
    from django.db import connections

    own = GroupCommitWriter(name="test-writer")
    yield own
    await asyncio.to_thread(own.control, connections.close_all)


def _make(user, title: str) -> Conversation:
    Conversation.objects.create(owner=user, title=title)


def _fail(message: str) -> None:
    raise ValueError(message)


def _rolled_back(user, title: str) -> str:
    Conversation.objects.create(owner=user, title=title)
    transaction.set_rollback(True)
    return "rolled back"


async def _titles() -> set[str]:
    return set(await sync_to_async(lambda: list(Conversation.objects.values_list("title", flat=True)))())


async def test_jobs_queued_together_commit_in_one_batch_and_each_gets_its_result(user, writer):
    gate = threading.Event()
    # Hold the thread on a first job so the next ones queue up behind it and form one batch.
    first = writer.write(lambda: gate.wait(10))
    await asyncio.sleep(0)
    jobs = [writer.write(lambda i=i: (_make(user, f"t{i}"), i)[1]) for i in range(5)]
    gate.set()
    assert await first is True
    assert await asyncio.gather(*jobs) == [0, 1, 2, 3, 4]
    assert await _titles() == {f"t{i}" for i in range(5)}
    assert writer.jobs == 6 and writer.batches <= 3  # the five queued jobs shared a transaction


async def test_a_failing_job_fails_alone_and_a_rollback_undoes_only_its_job(user, writer):
    gate = threading.Event()
    first = writer.write(lambda: gate.wait(10))
    await asyncio.sleep(0)
    ok = writer.write(_make, user, "kept")
    bad = writer.write(_fail, "broken job")
    undone = writer.write(_rolled_back, user, "undone")
    also_ok = writer.write(_make, user, "kept too")
    gate.set()
    await first
    results = await asyncio.gather(ok, bad, undone, also_ok, return_exceptions=True)
    assert results[0] is None and results[2] == "rolled back" and results[3] is None
    assert isinstance(results[1], ValueError) and str(results[1]) == "broken job"
    assert await _titles() == {"kept", "kept too"}


async def test_a_merged_group_that_fails_runs_again_job_by_job(user, writer):
    calls: list[int] = []

    def one(title: str) -> None:
        if title == "dup":
            raise IntegrityError("duplicate")
        _make(user, title)

    def merged(args_list: list[tuple]) -> None:
        calls.append(len(args_list))
        for (title,) in args_list:
            one(title)

    gate = threading.Event()
    first = writer.write(lambda: gate.wait(10))
    await asyncio.sleep(0)
    futures = [writer.write(one, title, merge=merged) for title in ("a", "dup", "b")]
    gate.set()
    await first
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert calls == [3]  # tried together once, then one by one
    assert results[0] is None and results[2] is None and isinstance(results[1], IntegrityError)
    assert await _titles() == {"a", "b"}


async def test_write_sync_from_a_thread_and_control_calls_wait_for_earlier_jobs(user, writer):
    result = await asyncio.to_thread(writer.write_sync, lambda: (_make(user, "from a thread"), "done")[1])
    assert result == "done"
    with pytest.raises(ValueError, match="nope"):
        await asyncio.to_thread(writer.write_sync, _fail, "nope")
    pending = writer.write(_make, user, "before the control call")
    seen: list[set] = []
    await asyncio.to_thread(writer.control, lambda: seen.append(set(Conversation.objects.values_list("title", flat=True))))
    await pending
    assert "before the control call" in seen[0]


async def test_concurrent_run_starts_share_transactions_and_all_land(user):
    from chat_app.group_commit import WRITER

    before = WRITER.batches
    created = await asyncio.gather(*(services.run_start(user=user, input=f"hello {i}", agent_role="coder")
                                     for i in range(8)))
    ends = await asyncio.gather(*(_last_event(str(c.run.id)) for c in created))
    assert all(e.payload["status"] == "succeeded" for e in ends)
    assert WRITER.batches > before


async def _last_event(run_id: str):
    return [e async for e in services.run_subscribe(run_id=run_id)][-1]


BODIES = [
    {"input": "bench", "agentRole": "coder", "model": "m"},
    {"input": "  keep my spaces  ", "agentRole": "  coder  ", "model": "", "engine": None},
    {"input": "a", "regenerate": True, "conversationId": "c"},
    {"input": "a", "regenerate": False, "provider": "p", "unknown": [1, 2]},
    {"input": "é ünïcode ✓", "agentRole": "coder"},
    # Everything below is refused (or left to the serializer) and must give the serializer's error.
    {"input": ""}, {"input": "   "}, {"input": 5}, {"input": None}, {"agentRole": "coder"},
    {"input": "a", "regenerate": True}, {"input": "a", "regenerate": "true"}, {"input": "a\x00b"},
    {"input": "a", "agentRole": "x" * 65}, {"input": "bad \ud800 surrogate"}, {"input": ["list"]},
    {"input": "a", "model": 3}, {"input": "a", "conversationId": {"id": 1}},
    {"input": "a", "regenerate": None}, {"input": "a", "engine": None, "model": None}, {"input": "a", "engine": "  "},
    {"title": "t"}, {"title": "", "agentRole": "coder"}, {"title": None}, {"agentRole": "not a slug!"},
]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("serializer_cls", [AgentChatInput, AiSdkChatOptionsInput, ConversationCreateInput])
def test_fast_validation_gives_exactly_what_the_serializer_gives_or_defers_to_it(serializer_cls, body):
    serializer = serializer_cls(data=body)
    valid = serializer.is_valid()
    fast = fast_validated_data(serializer_cls, body)
    if fast is not None:
        assert valid and fast == dict(serializer.validated_data)
    if body is BODIES[0] and serializer_cls is not ConversationCreateInput:
        assert fast is not None  # the common body takes the fast path


async def _deferred_start(user, text: str):
    from chat_app.eventlog import in_thread
    from chat_app.executor import get_executor

    created = await in_thread(services.run_create)(user=user, input=text, agent_role="coder", defer_commit=True)
    get_executor().submit(created.launch)
    return created


def _hold_writer():
    """Block the writer thread until the returned event is set: later jobs queue behind it."""
    from chat_app.group_commit import WRITER

    gate = threading.Event()
    held = WRITER.write(lambda: gate.wait(20))
    return gate, held


async def test_a_stream_starts_before_the_start_commit_and_everything_lands_after_it(user):
    from chat_app.models import Run, RunEvent

    gate, held = _hold_writer()
    try:
        created = await _deferred_start(user, "hello before the commit")
        seen = []
        async for event in services.run_subscribe(run_id=str(created.run.id)):
            seen.append(event)
            if event.event == "agent.delta":
                break  # the model's text reached the subscriber ...
        assert seen[0].event == "agent.start"
        assert not await Run.objects.filter(id=created.run.id).aexists()  # ... with no row written yet
    finally:
        gate.set()
    await held
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    assert events[-1].event == "agent.end" and events[-1].payload["status"] == "succeeded"
    run = await Run.objects.aget(id=created.run.id)
    assert run.status == "succeeded"
    stored = await sync_to_async(list)(RunEvent.objects.filter(run_id=run.id).order_by("seq").values_list("seq", flat=True))
    assert stored == [e.seq for e in events]


async def test_cancel_right_after_start_waits_for_the_start_commit(user):
    from chat_app.models import Run

    gate, held = _hold_writer()
    try:
        created = await _deferred_start(user, "/sleep 5")
        cancel = asyncio.ensure_future(services.run_cancel(user=user, run_id=str(created.run.id)))
        await asyncio.sleep(0.2)
        assert not cancel.done()  # it waits for the run's rows instead of answering 404
    finally:
        gate.set()
    await held
    run = await asyncio.wait_for(cancel, 15)
    assert run.status == "cancelled"
    assert (await Run.objects.aget(id=created.run.id)).status == "cancelled"


async def test_postgres_a_job_stuck_behind_a_row_lock_fails_alone(user, writer, monkeypatch):
    from django.db import connection

    from chat_app import group_commit

    if connection.vendor != "postgresql":
        pytest.skip("the lock timeout is PostgreSQL's; this runs in the PostgreSQL pass")

    monkeypatch.setattr(group_commit, "LOCK_TIMEOUT", 0.3)
    conversation = await Conversation.objects.acreate(owner=user, title="locked")
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:  # another session holds the row while the writer wants it
        from django.db import connections
        try:
            with transaction.atomic():
                Conversation.objects.select_for_update().get(pk=conversation.pk)
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = asyncio.ensure_future(asyncio.to_thread(hold_lock))
    await asyncio.to_thread(locked.wait, 10)
    try:
        stuck = writer.write(lambda: Conversation.objects.filter(pk=conversation.pk).update(title="never"))
        fine = writer.write(_make, user, "not held up")
        results = await asyncio.wait_for(asyncio.gather(stuck, fine, return_exceptions=True), 10)
    finally:
        release.set()
        await holder
    assert isinstance(results[0], Exception) and "lock" in str(results[0]).lower()
    assert results[1] is None
    assert "not held up" in await _titles() and "never" not in await _titles()


async def test_reads_of_a_just_started_run_and_its_conversation_wait_for_its_start_rows(user):
    from django.core.exceptions import SynchronousOnlyOperation

    from chat_app import selectors
    from chat_app.group_commit import wait_written

    gate, held = _hold_writer()
    try:
        created = await _deferred_start(user, "/sleep 5")
        with pytest.raises(SynchronousOnlyOperation):  # never blocks the event loop
            wait_written(created.conversation.id)
        read = asyncio.ensure_future(asyncio.to_thread(
            selectors.conversation_get, user=user, conversation_id=str(created.conversation.id)))
        run_read = asyncio.ensure_future(asyncio.to_thread(selectors.run_get, user=user, run_id=str(created.run.id)))
        await asyncio.sleep(0.2)
        assert not read.done() and not run_read.done()  # waiting, not answering 404
    finally:
        gate.set()
    await held
    assert (await asyncio.wait_for(read, 10)).id == created.conversation.id
    assert (await asyncio.wait_for(run_read, 10)).id == created.run.id
    await services.run_cancel(user=user, run_id=str(created.run.id))


async def test_start_rows_wait_for_the_record_delay_unless_a_read_needs_them(user, settings):
    from chat_app import selectors
    from chat_app.group_commit import WRITER
    from chat_app.models import Run

    settings.RUN_RECORD_DELAY = 60  # far longer than this test may take
    created = await _deferred_start(user, "/sleep 5")
    await WRITER.write(lambda: None)  # a later write has been committed ...
    assert not await Run.objects.filter(id=created.run.id).aexists()  # ... the start rows still wait
    # A read in this process (in a thread, as the API reads) has them written and finds the run.
    run = await asyncio.wait_for(asyncio.to_thread(selectors.run_get, user=user, run_id=str(created.run.id)), 15)
    assert run.id == created.run.id and run.status == "running"
    cancelled = await asyncio.wait_for(services.run_cancel(user=user, run_id=str(created.run.id)), 15)
    assert cancelled.status == "cancelled"


async def test_a_run_that_ends_within_the_record_delay_is_recorded_at_its_end(user, settings):
    from chat_app.models import Run, RunEvent

    settings.RUN_RECORD_DELAY = 60
    created = await _deferred_start(user, "hello, quickly")
    events = await asyncio.wait_for(_all_events(str(created.run.id)), 15)
    assert events[-1].event == "agent.end" and events[-1].payload["status"] == "succeeded"
    run = await Run.objects.aget(id=created.run.id)
    assert run.status == "succeeded"
    stored = await sync_to_async(list)(RunEvent.objects.filter(run_id=run.id).order_by("seq").values_list("seq", flat=True))
    assert stored == [e.seq for e in events]


async def test_start_rows_land_after_the_record_delay_with_nobody_asking(user, settings):
    from chat_app.models import Run

    settings.RUN_RECORD_DELAY = 0.05
    created = await _deferred_start(user, "/sleep 5")

    async def landed() -> None:
        while not await Run.objects.filter(id=created.run.id).aexists():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(landed(), 10)
    await services.run_cancel(user=user, run_id=str(created.run.id))


async def _all_events(run_id: str) -> list:
    return [e async for e in services.run_subscribe(run_id=run_id)]


def _commit_record(record) -> None:
    from chat_app.executor import record_run

    with transaction.atomic():
        record_run(record)


async def test_a_run_announced_by_another_process_is_read_once_its_rows_land(user, settings):
    from chat_app import selectors
    from chat_app.eventlog import in_thread

    settings.RUN_RECORD_DELAY = 0.02
    # Prepared but not submitted here: as if another process executed it, its rows not yet written.
    created = await in_thread(services.run_create)(user=user, input="elsewhere", agent_role="coder", defer_commit=True)
    run_id = str(created.run.id)
    attempts = []

    async def read():
        attempts.append(run_id)
        if len(attempts) == 2:  # the first read found nothing; the other process commits now
            await in_thread(_commit_record)(created.launch.record)
        return await in_thread(selectors.run_get)(user=user, run_id=run_id)

    run = await asyncio.wait_for(services.run_read(read, run_id=run_id), 10)
    assert run.id == created.run.id and len(attempts) == 2


async def test_an_unknown_run_is_not_found_after_a_few_reads_and_a_malformed_id_at_once(user, settings):
    import uuid

    from chat_app import selectors
    from chat_app.eventlog import in_thread
    from core.errors import NotFound

    settings.RUN_RECORD_DELAY = 0.02
    for run_id, expected_reads in ((str(uuid.uuid4()), range(2, 20)), ("not-a-run", range(1, 2))):
        attempts = []

        async def read():
            attempts.append(run_id)
            return await in_thread(selectors.run_get)(user=user, run_id=run_id)

        with pytest.raises(NotFound) as caught:
            await asyncio.wait_for(services.run_read(read, run_id=run_id), 10)
        assert caught.value.code == "run_not_found"
        assert len(attempts) in expected_reads


async def test_a_deferred_write_waits_while_busy_and_lands_when_quiet():
    from chat_app.group_commit import BUSY_RECHECK, WRITER

    busy = [True]
    written = []
    deferred = WRITER.write_later(0.01, lambda: written.append("rows"), busy=lambda: busy[0], latest=30)
    await asyncio.sleep(0.01 + 4 * BUSY_RECHECK)
    assert not written and not deferred.future.done()  # past its delay, but the loop is busy
    busy[0] = False
    await asyncio.wait_for(deferred.future, 10)
    assert written == ["rows"]


async def test_a_deferred_write_waits_no_longer_than_its_latest():
    from chat_app.group_commit import WRITER

    loop = asyncio.get_running_loop()
    start = loop.time()
    deferred = WRITER.write_later(0.01, lambda: loop.time(), busy=lambda: True, latest=0.2)
    await asyncio.wait_for(deferred.future, 10)
    assert loop.time() - start >= 0.2


async def test_start_rows_wait_while_another_run_waits_for_its_first_output(user, settings):
    """A burst: the rows of a run that has answered wait while another run of the process still
    waits for its model's first output — until RUN_RECORD_MAX_DELAY at most."""
    from chat_app.models import Run

    settings.RUN_RECORD_DELAY = 0.01
    settings.RUN_RECORD_MAX_DELAY = 60  # far longer than this test may take
    slow = await _deferred_start(user, "/sleep 30")  # no output for 30 s: "starting" all along
    quick = await _deferred_start(user, "/sleep 30")
    await asyncio.sleep(0.3)  # far past RUN_RECORD_DELAY
    assert not await Run.objects.filter(id__in=[slow.run.id, quick.run.id]).aexists()
    settings.RUN_RECORD_MAX_DELAY = 0.05  # (read when a run is submitted) a third run, bounded sooner
    bounded = await _deferred_start(user, "/sleep 30")

    async def landed() -> None:
        while not await Run.objects.filter(id=bounded.run.id).aexists():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(landed(), 10)  # its own limit, though the others still wait for output
    for created in (slow, quick, bounded):
        await asyncio.wait_for(services.run_cancel(user=user, run_id=str(created.run.id)), 15)


async def test_start_rows_land_once_every_run_has_answered(user, settings):
    from chat_app.models import Run

    settings.RUN_RECORD_DELAY = 0.01
    settings.RUN_RECORD_MAX_DELAY = 60
    settings.RUN_EVENT_FLUSH_INTERVAL = 60  # (an event batch would have the rows written at once)
    slow = await _deferred_start(user, "/sleep 0.3")  # its first output comes after 0.3 s
    quick = await _deferred_start(user, "/drip 100 0.05\nstill talking")  # answers at once, for 5 s
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def landed() -> None:
        while not await Run.objects.filter(id=quick.run.id).aexists():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(landed(), 10)
    assert loop.time() - start >= 0.25  # not before the slow run's first output
    events = await asyncio.wait_for(_all_events(str(slow.run.id)), 15)
    assert events[-1].payload["status"] == "succeeded"
    await asyncio.wait_for(services.run_cancel(user=user, run_id=str(quick.run.id)), 15)
