"""Where a round's time to first delta goes: per-request timestamps inside the servers.

``bench/stream_bench.py`` measures the first text delta from the client; this shows what each
server did meanwhile. It starts the fake upstream, the bare relay and the project (SQLite, or
PostgreSQL + Redis with ``--postgres``) with the timestamp hooks of
``bench/timeline_hooks/sitecustomize.py`` on their PYTHONPATH, runs rounds of ``--concurrency``
streams sent at once (as the benchmark's first-delta measurement does, same model and checks),
and prints, for each phase, the median over rounds of the first, the median and the last
request's time since the round's first request arrived at the server::

    .venv/bin/python bench/round_timeline.py [--concurrency 50] [--rounds 6] [--postgres] [--steps]

Phases: ``request`` (daphne has the whole request), ``provider request`` (the SDK's HTTP
connection starts sending the request to the upstream), ``provider body sent`` (it has written
the request body; the upstream can answer), ``provider response`` (it has read the
upstream's response headers), ``response head`` / ``first body`` (the server hands daphne its
response start / first body), ``first text`` (the first body with a text delta). A figure, not
a test; the hooks cost a few microseconds per mark, alike for both servers.

``--steps`` also records every callback each server's event loop runs during the rounds and
prints, per kind of step (a task resuming at a given await, or a callback), the milliseconds per
round it took in two windows: from the round's first request to its last provider request
written (everything every stream does before its provider can answer), and from there to the
round's last first text. Under a burst asyncio runs one step of every stream per pass, so these
sums are what the median first delta waits for. Recording costs each step a few microseconds.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import stream_bench as sb  # noqa: E402

HOOKS = Path(__file__).resolve().parent / "timeline_hooks"
PHASES = ("request", "provider request", "provider body sent", "provider response", "response head", "first body", "first text")


def _phases(marks: list[tuple[float, str]], rounds: list[tuple[float, float]]) -> dict[str, list[tuple[float, float, float]]]:
    """phase -> one (first, median, last) per round, in ms since the round's first request."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for start, end in rounds:
        inside = [(t, phase) for t, phase in marks if start <= t <= end]
        requests = [t for t, phase in inside if phase == "request"]
        if not requests:
            continue
        t0 = min(requests)
        for phase in PHASES:
            times = sorted((t - t0) * 1000 for t, p in inside if p == phase)
            if times:
                out.setdefault(phase, []).append((times[0], statistics.median(times), times[-1]))
    return out


def _print_steps(title: str, dump: dict, rounds: list[tuple[float, float]], top: int = 12) -> None:
    """Per kind of loop step, ms per round before the last provider request and after it."""
    marks, steps = dump["marks"], dump["steps"]
    windows: list[collections.Counter] = [collections.Counter(), collections.Counter()]
    lengths: list[list[float]] = [[], []]
    for start, end in rounds:
        inside = [(t, phase) for t, phase in marks if start <= t <= end]
        requests = [t for t, phase in inside if phase == "request"]
        sent = [t for t, phase in inside if phase == "provider body sent"]
        texts = [t for t, phase in inside if phase == "first text"]
        if not (requests and sent and texts):
            continue
        bounds = ((min(requests), max(sent)), (max(sent), max(texts)))
        for i, (lo, hi) in enumerate(bounds):
            lengths[i].append((hi - lo) * 1000)
            window = [step for step in steps if lo <= step[0] <= hi]
            for (t, name), (t_next, _) in zip(window, window[1:]):
                windows[i][name] += (t_next - t) * 1000
    if not lengths[0]:
        return
    n = len(lengths[0])
    labels = ("first request -> last provider request written", "-> last first text")
    print(f"\n{title}: loop steps, ms per round ({n} rounds)\n")
    for i, label in enumerate(labels):
        print(f"| {label} (median {statistics.median(lengths[i]):.1f} ms) | ms |")
        print("|---|---|")
        for name, ms in windows[i].most_common(top):
            print(f"| `{name[:110]}` | {ms / n:.2f} |")
        print()


async def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="round-timeline-"))
    servers = sb.Servers(workdir)
    pg = None
    try:
        upstream = await sb.start_upstream(servers)
        env = sb.base_env(upstream)
        files = {"bare": workdir / "bare.json", "project": workdir / "project.json"}
        hooked = {**env, "PYTHONPATH": f"{sb.REPO}{os.pathsep}{HOOKS}", **({"TIMELINE_STEPS": "1"} if args.steps else {})}
        bare = sb.Target("bare", "bare", sb.free_port(), "/relay", "bare")
        servers.spawn("bare", [sys.executable, "-m", "daphne", "-b", sb.HOST, "-p", str(bare.port), "bench.bare_relay:app"],
                      {**hooked, "TIMELINE_FILE": str(files["bare"])})
        project = sb.Target("project", "project", sb.free_port(), "/v1/agent/chat", "project",
                            sqlite_file=None if args.postgres else workdir / "bench.sqlite3")
        project_env = {**hooked, "TIMELINE_FILE": str(files["project"]), "WORKSPACES_ROOT": str(workdir / "ws")}
        if args.postgres:
            pg = sb.Postgres()
            project.pg_db = sb.PG_DB
            project_env.update(DATABASE_URL=pg.recreate(sb.PG_DB), REDIS_URL=sb.REDIS_URL)
        else:
            project_env["DATABASE_URL"] = f"sqlite:///{project.sqlite_file}"
        await asyncio.gather(sb.wait_listening(servers, "bare", bare.port, None, limit=30),
                             sb.start_project(servers, project, project_env))
        problems: list[str] = []
        targets = [bare, project]
        for target in targets:
            target.proc = servers.procs[target.key]
            await sb.warm_up(target, problems)
        if args.steps:
            for target in targets:
                os.kill(target.pid, signal.SIGUSR1)  # record loop steps from here on
        rounds: dict[str, list[tuple[float, float]]] = {t.key: [] for t in targets}
        client: dict[str, list[float]] = {t.key: [] for t in targets}
        for _ in range(args.rounds):
            for target in targets:  # interleaved, so drift hits both alike
                await sb.wait_quiet([t.pid for t in targets])
                start = time.perf_counter()
                results = await asyncio.gather(*(sb.stream(target, sb.RATE_MODEL, sb.Stream(), timeout=20)
                                                 for _ in range(args.concurrency)))
                rounds[target.key].append((start, time.perf_counter()))
                for result in results:
                    sb.verify(target, result, sb.RATE_DELTAS, "round", problems)
                client[target.key] += [(r.first_text - r.t0) * 1000 for r in results if r.first_text]
        for target in targets:
            os.kill(target.pid, signal.SIGUSR2)
        await asyncio.sleep(1)
        print(f"c={args.concurrency}, {args.rounds} rounds; ms since the round's first request reached the server: "
              "first / median / last request (median over rounds)\n")
        print("| phase | " + " | ".join(t.title for t in targets) + " |")
        print("|---|" + "---|" * len(targets))
        dumps = {t.key: json.loads(files[t.key].read_text()) for t in targets}
        phases = {t.key: _phases(dumps[t.key]["marks"], rounds[t.key]) for t in targets}
        for phase in PHASES:
            cells = []
            for target in targets:
                per_round = phases[target.key].get(phase)
                cells.append("—" if not per_round else " / ".join(
                    f"{statistics.median(r[i] for r in per_round):.1f}" for i in range(3)))
            print(f"| {phase} | " + " | ".join(cells) + " |")
        print("| first text at the client (p50, from its connect) | "
              + " | ".join(f"{statistics.median(client[t.key]):.1f}" for t in targets) + " |")
        if args.steps:
            for target in targets:
                _print_steps(target.title, dumps[target.key], rounds[target.key])
        if problems:
            print(f"\nWrong output in {len(problems)} stream(s):\n" + "\n".join(problems[:10]), file=sys.stderr)
        return 1 if problems else 0
    finally:
        servers.stop_all()
        if pg is not None:
            pg.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--postgres", action="store_true", help="the project on PostgreSQL + Redis")
    parser.add_argument("--steps", action="store_true", help="also where each event-loop pass went (see above)")
    args = parser.parse_args()
    try:
        return asyncio.run(run(args))
    except sb.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
