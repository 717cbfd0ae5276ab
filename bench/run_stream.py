"""Benchmark: how fast the run service streams and records a long reply (mock engine, no model).

Prints events/second delivered to a subscriber, the number of database write batches, and peak
memory, for a 5,000-delta reply and for 20 concurrent runs. Run with:

    .venv/bin/python bench/run_stream.py

Uses a temporary SQLite database (or DATABASE_URL if set). Figures, never assertions.
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
tmp = tempfile.mkdtemp(prefix="bench-")
os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp}/bench.db")
os.environ.setdefault("WORKSPACES_ROOT", f"{tmp}/ws")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator_site.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402


async def one_run(user, words: int) -> tuple[int, float]:
    from chat_app import services

    text = " ".join(f"w{i}" for i in range(words))
    start = time.perf_counter()
    created = await services.run_start(user=user, input=text, agent_role="coder")
    count = 0
    async for _ in services.run_subscribe(run_id=str(created.run.id)):
        count += 1
    return count, time.perf_counter() - start


async def main() -> None:
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model

    from chat_app.models import RunEvent

    user = await sync_to_async(lambda: get_user_model().objects.get_or_create(username="bench")[0])()
    await one_run(user, 100)  # warm up imports and connections
    events, seconds = await one_run(user, 15_000)
    print(f"single run: {events} events in {seconds:.3f} s = {events / seconds:,.0f} events/s")
    tracemalloc.start()
    await one_run(user, 15_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"  peak traced memory during a 5,000-delta run: {peak / 1e6:.1f} MB")
    start = time.perf_counter()
    results = await asyncio.gather(*(one_run(user, 3_000) for _ in range(20)))
    wall = time.perf_counter() - start
    total = sum(r[0] for r in results)
    print(f"20 concurrent runs: {total} events in {wall:.3f} s = {total / wall:,.0f} events/s")
    stored = await RunEvent.objects.acount()
    print(f"events stored: {stored}")


if __name__ == "__main__":
    call_command("migrate", verbosity=0)
    asyncio.run(main())
