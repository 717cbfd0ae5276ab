"""Streaming benchmark: the project's chat stream beside a bare relay of the same model stream.

One run starts, each as its own process: a fake Anthropic upstream (``bench/fake_upstream.py``),
the bare baseline (``bench/bare_relay.py``: raw ASGI on daphne, the same ``anthropic`` SDK, no
framework, no database) and the project as a user starts it (``manage.py serve``, daphne) on
SQLite and, unless ``--skip-postgres``, on PostgreSQL + Redis. This script is the client: it
speaks HTTP/1.1 over raw asyncio sockets, one fresh connection per stream, and reads only the
HTTP contract (``POST /relay`` for the baseline; ``POST /v1/agent/chat`` with a DRF token for the
project), so it keeps working whatever the project's internals become. Run from the repository
root (it benchmarks the code of the checkout it lives in)::

    .venv/bin/python bench/stream_bench.py [--quick] [--skip-postgres] [--idle N] [--label TEXT]

It prints a markdown table on stdout (progress on stderr) and writes ``bench/RESULTS.md``. About
5-6 minutes; ``--quick`` about 1.5 minutes (fewer samples, fewer idle streams, shorter windows).
Figures, never timing assertions; it exits non-zero only when a server does not start or a
stream's content is wrong (lost, reordered or extra text, or a wrong final status).

What is measured, for each server:

1. One stream, tokens/s: the upstream sends 5,000 ``"tok "`` deltas as fast as it can; tokens =
   received text length / 4 (so merged deltas still count exactly), divided by the wall time from
   just before the TCP connect to the final event (``done`` / ``agent.end``). Median of several
   sequential runs, the servers interleaved run by run so drift hits them alike.
2. Server CPU µs per relayed delta: utime+stime of the server process (/proc/<pid>/stat, all
   threads) across those runs, read before each run and 0.25 s after its final event (so
   trailing writes count), divided by the deltas relayed.
3. Time to first text delta (first ``content_delta`` / first non-empty ``agent.delta``, not
   ``conversation.created`` or ``agent.start``) from just before the TCP connect, p50 and p95, at
   concurrency 1, 10 and 50: rounds of c requests sent at once (so p50 grows with what the server
   spends starting each stream), the servers taking turns round by round (c=1 varies by about a
   millisecond between blocks of rounds on this 2-core VM, more than a server's own change); the
   upstream sends a delta at once, then 19 more at 100/s. Beside it, the server's CPU per stream across those rounds (from the requests to their ends): on two
   cores, what the server spends per stream is what the later streams of a round wait for.
4. Idle streams: N streams (default 2,000) whose upstream sends ``message_start`` and then
   nothing, opened with at most 100 waiting for their first byte at a time. Established = first
   response byte received, within a bounded window; "stalled at N" when no stream got its first
   byte for a while. Then, during a hold of two ping intervals (servers run with
   ``SSE_PING_INTERVAL=2``): server RSS growth per established stream (VmRSS), threads, database
   connections held (SQLite: the server's file handles on the database file; PostgreSQL:
   ``pg_stat_activity`` rows for the bench database), streams still receiving pings, and the
   server's CPU. Database connections are counted before the idle streams open, during the hold
   and after the streams closed (the server quiet again): the server's pool is a fixed set of
   threads that keep their connections once opened (warmed by whatever ran meanwhile, e.g. the
   run keeper's lease renewals), so the streams' own are those open during and gone after
   (the target: 0). Idle streams are measured last, and each server is stopped after its turn.

Before each measurement the script waits (bounded) until the servers are idle, so one server's
leftover work does not land in another's figures. The machine's load average is recorded, as
other processes on a 2-core box add noise.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
DELTA = "tok "  # every upstream delta's text (bench/fake_upstream.py)
PING_INTERVAL = 2
FAST_DELTAS = 5000
RATE_DELTAS, RATE_PER_SECOND = 20, 100
RATE_MODEL = f"bench-rate-{RATE_PER_SECOND}x{RATE_DELTAS}"
HANG_MODEL = "bench-hang-120"
IDLE_TARGET = 2000
IDLE_PENDING = 100  # idle streams allowed to wait for their first byte at once
PG_DB = "stream_bench"
REDIS_URL = "redis://127.0.0.1:6379/14"
PROJECT_ROLE = "dev_efficiency_analyst"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Plan:
    repeats: int  # one-stream runs per server
    ttfe: tuple[tuple[int, int], ...]  # (concurrency, rounds)
    idle: int  # idle streams to open
    idle_window: float  # seconds allowed to open them
    stall_after: float  # seconds without a newly established stream that count as a stall


# 20 rounds at c=10 and 12 at c=50: with 10 and 6, the medians' ratio to the bare relay swung by
# about +-0.2 from run to run on the slower kind of machine here.
FULL = Plan(repeats=5, ttfe=((1, 40), (10, 20), (50, 12)), idle=IDLE_TARGET, idle_window=60, stall_after=10)
QUICK = Plan(repeats=3, ttfe=((1, 10), (10, 2), (50, 1)), idle=300, idle_window=8, stall_after=4)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A server did not start or answered wrongly: the run cannot produce figures."""


# --- /proc probes ---------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, every thread


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def sqlite_handles(pid: int, db_file: Path) -> tuple[int, int]:
    """(handles on the database file itself = connections, handles on it and its -wal/-shm)."""
    main = str(db_file)
    on_main = on_any = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target == main:
                on_main += 1
            if target in (main, main + "-wal", main + "-shm"):
                on_any += 1
    return on_main, on_any


def open_files_limit(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return line.split()[3]
    return "?"


async def wait_quiet(pids: list[int], limit: float = 10.0) -> None:
    """Wait (at most ``limit`` s) until every process uses under 5 % of a core over 0.25 s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        before = [cpu_seconds(pid) for pid in pids]
        await asyncio.sleep(0.25)
        if all(cpu_seconds(pid) - b < 0.0125 for pid, b in zip(pids, before)):
            return


# --- servers --------------------------------------------------------------------------------------

def _child_setup() -> None:
    """In each server: a high open-files limit, and die with the benchmark (PR_SET_PDEATHSIG)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@dataclass
class Target:
    """One server under test and how to talk to it."""

    key: str
    title: str
    port: int
    path: str
    dialect: str  # "bare" or "project"
    proc: subprocess.Popen | None = None
    token: str = ""
    sqlite_file: Path | None = None
    pg_db: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, model: str) -> bytes:
        if self.dialect == "bare":
            body, auth = json.dumps({"model": model}).encode(), ""
        else:
            body = json.dumps({"input": "bench", "agentRole": PROJECT_ROLE, "model": model}).encode()
            auth = f"Authorization: Token {self.token}\r\n"
        return (
            f"POST {self.path} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n{auth}Content-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body


class Servers:
    """Starts the processes and stops every one of them (by pid) on exit, error or Ctrl-C."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, argv: list[str], env: dict[str, str], stdout: int | None = None) -> subprocess.Popen:
        logfile = open(self.workdir / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=stdout or logfile, stderr=logfile,
                                stdin=subprocess.DEVNULL, preexec_fn=_child_setup)
        logfile.close()
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def log_errors(self, name: str, top: int = 3) -> list[tuple[int, str]]:
        """The most frequent exception lines in a server's log, with their counts."""
        path = self.workdir / f"{name}.log"
        counts: dict[str, int] = {}
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Timeout)\w*: ", line):
                counts[line[:200]] = counts.get(line[:200], 0) + 1
        return sorted(((n, line) for line, n in counts.items()), reverse=True)[:top]

    def check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise BenchError(f"{name} exited with status {proc.returncode}; its log ends:\n{self.log_tail(name)}")

    def stop(self, name: str, grace: float = 5.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def base_env(upstream_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({
        "ANTHROPIC_API_KEY": "bench-key", "ANTHROPIC_BASE_URL": f"http://{HOST}:{upstream_port}",
        "ANTHROPIC_MAX_RETRIES": "0", "SSE_PING_INTERVAL": str(PING_INTERVAL), "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    })
    return env


async def start_upstream(servers: Servers) -> int:
    proc = servers.spawn("upstream", [sys.executable, str(REPO / "bench" / "fake_upstream.py")], dict(os.environ),
                         stdout=subprocess.PIPE)
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 10)
    match = re.search(rb":(\d+)\s*$", line)
    if not match:
        servers.check_alive("upstream")
        raise BenchError(f"fake upstream printed {line!r} instead of its port")
    return int(match[1])


async def wait_listening(servers: Servers, name: str, port: int, path: str | None, limit: float) -> None:
    """Until the port accepts (and ``GET path`` answers 200, when given), at most ``limit`` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        servers.check_alive(name)
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection(HOST, port)
            try:
                if path is None:
                    return
                writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n".encode())
                response = await asyncio.wait_for(reader.read(), 10)
                if response.startswith(b"HTTP/1.1 200"):
                    return
            finally:
                writer.close()
        await asyncio.sleep(0.2)
    raise BenchError(f"{name} did not answer on port {port} within {limit:g} s; its log ends:\n{servers.log_tail(name)}")


async def run_checked(argv: list[str], env: dict[str, str], what: str) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, preexec_fn=_child_setup)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise BenchError(f"{what}: no answer within 120 s") from None
    if proc.returncode:
        raise BenchError(f"{what} failed ({proc.returncode}):\n{out.decode(errors='replace')}")
    return out.decode(errors="replace")


async def start_project(servers: Servers, target: Target, env: dict[str, str]) -> None:
    """``manage.py serve`` as a user runs it, then a user and a DRF token through manage.py."""
    env = {**env, "HOST": HOST, "PORT": str(target.port)}
    servers.spawn(target.key, [sys.executable, "manage.py", "serve"], env)
    await wait_listening(servers, target.key, target.port, "/health", limit=120)
    health = await http_get_json(target.port, "/health")
    if not health.get("engines", {}).get("claude", {}).get("live"):
        raise BenchError(f"{target.title}: the claude engine is not live: {health.get('engines')}")
    manage = [sys.executable, "manage.py"]
    await run_checked([*manage, "createsuperuser", "--noinput", "--username", "bench", "--email", "bench@example.com"],
                      {**env, "DJANGO_SUPERUSER_PASSWORD": "bench-password"}, f"{target.title}: createsuperuser")
    out = await run_checked([*manage, "drf_create_token", "bench"], env, f"{target.title}: drf_create_token")
    match = re.search(r"Generated token (\w+)", out)
    if not match:
        raise BenchError(f"{target.title}: drf_create_token printed {out!r}")
    target.token = match[1]


async def http_get_json(port: int, path: str) -> dict:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return json.loads(body)


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[eol + 2:eol + 2 + size]
        pos = eol + 2 + size + 2


# --- PostgreSQL and Redis ------------------------------------------------------------------------

class Postgres:
    """The bench database and its role (both made afresh), and a probe of the connections to it.

    The project connects as its own role, limited to 20 fewer than the server's ``max_connections``: a
    project that holds a connection per stream then fails its own requests, not those of whoever
    else shares this PostgreSQL server.
    """

    def __init__(self):
        import psycopg

        self.conn = psycopg.connect(f"postgresql://postgres@{HOST}:5432/postgres", autocommit=True, connect_timeout=5)
        self.version = self.conn.execute("SHOW server_version").fetchone()[0]
        self.max_connections = self.conn.execute("SHOW max_connections").fetchone()[0]

    @property
    def role_limit(self) -> int:
        return max(10, int(self.max_connections) - 20)

    def recreate(self, name: str) -> str:
        """A fresh database and login role, both called ``name``; returns the project's DATABASE_URL."""
        self.conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.conn.execute(f'DROP ROLE IF EXISTS "{name}"')
        self.conn.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT {self.role_limit}')
        self.conn.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
        return f"postgresql://{name}@{HOST}:5432/{name}"

    def connections(self, db: str) -> int:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        return self.conn.execute(query, (db,)).fetchone()[0]

    def close(self) -> None:
        self.conn.close()


def redis_version() -> str:
    """Redis's version over a raw socket (raises OSError when it does not answer)."""
    with socket.create_connection((HOST, 6379), timeout=5) as sock:
        sock.sendall(b"INFO server\r\n")
        data = sock.recv(65536)  # a few hundred bytes, in one piece on loopback
    match = re.search(rb"redis_version:([^\r\n]+)", data)
    if not match:
        raise OSError(f"unexpected answer from Redis: {data[:80]!r}")
    return match[1].decode()


# --- the client -----------------------------------------------------------------------------------

@dataclass
class Stream:
    """What the client saw of one streamed response (times are perf_counter seconds)."""

    t0: float = 0.0
    status: int = 0
    first_byte: float | None = None
    first_text: float | None = None
    end: float | None = None
    end_status: str | None = None
    texts: list[str] = field(default_factory=list)
    text_frames: int = 0
    last_ping: float | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)


def parse_frame(dialect: str, frame: bytes) -> tuple[str, str | None]:
    """("text", text) | ("ping", None) | ("end", status) | ("error", message) | ("other", None)."""
    if dialect == "bare":
        if frame.startswith(b":"):
            return "ping", None
        message = json.loads(frame.partition(b"data: ")[2])
        kind = message.get("type")
        if kind == "content_delta":
            return "text", message["content"]
        if kind == "done":
            return "end", "done"
        return ("error", message.get("message")) if kind == "error" else ("other", None)
    data = next((line[6:] for line in frame.split(b"\n") if line.startswith(b"data: ")), None)
    if data is None:
        return ("ping", None) if frame.startswith(b":") else ("other", None)
    message = json.loads(data)
    event, payload = message.get("event"), message.get("data") or {}
    if event == "agent.delta":
        return "text", payload.get("text", "")
    if event == "ping":
        return "ping", None
    if event == "agent.end":
        return "end", payload.get("status")
    return ("error", json.dumps(payload)) if event == "error" else ("other", None)


async def _body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]):
    """The response body, piece by piece (chunked, Content-Length or until EOF)."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                return
            yield (await reader.readexactly(size + 2))[:-2]
    elif b"content-length" in headers:
        yield await reader.readexactly(int(headers[b"content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


async def stream(target: Target, model: str, result: Stream, *, timeout: float,
                 on_first_byte: Callable[[], None] | None = None) -> Stream:
    """Send one request on a fresh connection and read its SSE response to the end (or timeout)."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            result.t0 = time.perf_counter()
            reader, writer = await asyncio.open_connection(HOST, target.port, limit=1 << 20)
            writer.write(target.request(model))
            head = await reader.readuntil(b"\r\n\r\n")
            result.first_byte = time.perf_counter()
            lines = head.decode("latin-1").split("\r\n")
            result.status = int(lines[0].split()[1])
            headers = {k.strip().lower().encode(): v.strip().encode()
                       for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            if on_first_byte:
                on_first_byte()
            buffer = b""
            async for data in _body(reader, headers):
                buffer += data
                *frames, buffer = buffer.split(b"\n\n")
                for frame in frames:
                    if result.status != 200:
                        result.error = f"HTTP {result.status}: {frame[:300]!r}"
                        continue
                    kind, value = parse_frame(target.dialect, frame)
                    if kind == "text" and value:
                        result.first_text = result.first_text or time.perf_counter()
                        result.texts.append(value)
                        result.text_frames += 1
                    elif kind == "ping":
                        result.last_ping = time.perf_counter()
                    elif kind == "end":
                        result.end, result.end_status = time.perf_counter(), value
                    elif kind == "error":
                        result.error = value
            if result.status != 200 and not result.error:
                result.error = f"HTTP {result.status}: {buffer[:300]!r}"
    except TimeoutError:
        result.error = result.error or f"no end within {timeout:g} s"
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        result.error = result.error or f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
    return result


def verify(target: Target, result: Stream, deltas: int, what: str, problems: list[str]) -> None:
    """The text must be exactly the upstream's, and the stream must end as it should."""
    wanted = "done" if target.dialect == "bare" else "succeeded"
    if result.error or result.end_status != wanted or result.text != DELTA * deltas:
        problems.append(
            f"{target.title}, {what}: status {result.status}, end {result.end_status!r} (wanted {wanted!r}), "
            f"{len(result.text)} of {len(DELTA) * deltas} text characters"
            f"{'' if result.text == DELTA * (len(result.text) // len(DELTA)) else ' (not the upstream text)'}"
            f"{', error: ' + result.error if result.error else ''}")


# --- measurements ---------------------------------------------------------------------------------

async def warm_up(target: Target, problems: list[str]) -> None:
    for i, (model, deltas) in enumerate([("bench-fast-200", 200)] * 3 + [(RATE_MODEL, RATE_DELTAS)] * 2):
        verify(target, await stream(target, model, Stream(), timeout=60), deltas, f"warm-up {i + 1}", problems)


async def one_stream(targets: list[Target], repeats: int, problems: list[str]) -> dict[str, dict]:
    """Tokens/s, frames and server CPU per delta for sequential 5,000-delta streams."""
    runs: dict[str, list[Stream]] = {t.key: [] for t in targets}
    cpu: dict[str, float] = {t.key: 0.0 for t in targets}
    pids = [t.pid for t in targets]
    for rep in range(repeats):
        for target in targets:
            await wait_quiet(pids)
            before = cpu_seconds(target.pid)
            result = await stream(target, f"bench-fast-{FAST_DELTAS}", Stream(), timeout=60)
            await asyncio.sleep(0.25)
            cpu[target.key] += cpu_seconds(target.pid) - before
            verify(target, result, FAST_DELTAS, f"one stream, run {rep + 1}", problems)
            runs[target.key].append(result)
            log(f"  {target.title}: run {rep + 1}: {_tps(result):,.0f} tokens/s, {result.text_frames} text frames")
    figures = {}
    for target in targets:
        ok = [r for r in runs[target.key] if r.end]
        deltas = sum(len(r.text) // len(DELTA) for r in runs[target.key])
        figures[target.key] = {
            "tps_runs": [_tps(r) for r in ok],
            "tps": statistics.median(_tps(r) for r in ok) if ok else None,
            "frames": statistics.median(r.text_frames for r in ok) if ok else None,
            "cpu_s": cpu[target.key],
            "cpu_us": cpu[target.key] / deltas * 1e6 if deltas else None,
        }
    return figures


def _tps(result: Stream) -> float:
    return len(result.text) / len(DELTA) / (result.end - result.t0) if result.end else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def first_delta_times(targets: list[Target], concurrency: int, rounds: int, problems: list[str]) -> dict[str, dict]:
    """Rounds of ``concurrency`` requests sent at once, the servers taking turns round by round
    (the order reversed every other round), so the machine's drift hits them alike; the next
    round when all have ended and every server is idle."""
    results: dict[str, list[Stream]] = {t.key: [] for t in targets}
    wall: dict[str, float] = {t.key: 0.0 for t in targets}
    cpu: dict[str, float] = {t.key: 0.0 for t in targets}
    pids = [t.pid for t in targets]
    for index in range(rounds):
        for target in (targets if index % 2 == 0 else targets[::-1]):
            await wait_quiet(pids)
            started, cpu0 = time.perf_counter(), cpu_seconds(target.pid)
            results[target.key] += await asyncio.gather(
                *(stream(target, RATE_MODEL, Stream(), timeout=20) for _ in range(concurrency)))
            wall[target.key] += time.perf_counter() - started
            cpu[target.key] += cpu_seconds(target.pid) - cpu0
    return {t.key: _first_delta_figures(t, concurrency, results[t.key], wall[t.key], cpu[t.key], problems)
            for t in targets}


def _first_delta_figures(target: Target, concurrency: int, results: list[Stream], wall: float, cpu: float,
                         problems: list[str]) -> dict:
    for i, result in enumerate(results):
        verify(target, result, RATE_DELTAS, f"first delta at c={concurrency}, stream {i + 1}", problems)
    times = [(r.first_text - r.t0) * 1000 for r in results if r.first_text]
    if not times:
        return {"n": 0}
    return {"n": len(times), "p50": percentile(times, 0.50), "p95": percentile(times, 0.95), "max": max(times), "wall": wall,
            "cpu_ms": cpu / len(results) * 1000}


async def idle_streams(target: Target, plan: Plan, pg: Postgres | None) -> dict:
    """Open up to ``plan.idle`` silent streams, then measure what holding them costs the server."""
    pid = target.pid
    await wait_quiet([pid])
    rss0, threads0 = proc_status(pid, "VmRSS"), proc_status(pid, "Threads")
    # Connections the server already holds before any idle stream opens (its pool, after the
    # earlier measurements warmed it); see also the count after they closed, below.
    db0 = 0
    if target.sqlite_file is not None:
        db0 = sqlite_handles(pid, target.sqlite_file)[0]
    elif pg is not None and target.pg_db:
        db0 = await asyncio.to_thread(pg.connections, target.pg_db)
    pending = asyncio.Semaphore(IDLE_PENDING)
    results: list[Stream] = []
    tasks: list[asyncio.Task] = []
    progress = {"last": time.perf_counter()}

    async def one(result: Stream) -> None:
        released = False

        def opened() -> None:
            nonlocal released
            released = True
            progress["last"] = time.perf_counter()
            pending.release()

        try:
            await stream(target, HANG_MODEL, result, timeout=150, on_first_byte=opened)
            result.error = result.error or "the server ended the stream"
        finally:
            if not released:
                pending.release()

    start = time.perf_counter()
    deadline = start + plan.idle_window
    stalled = False

    def stop_opening() -> bool:
        nonlocal stalled
        now = time.perf_counter()
        waiting = sum(1 for r in results if r.first_byte is None and r.error is None)
        stalled = waiting > 0 and now - progress["last"] > plan.stall_after
        return stalled or now > deadline

    async def slot() -> bool:
        """Wait for a free opening slot; False when opening must stop (stall or deadline)."""
        while True:
            try:
                await asyncio.wait_for(pending.acquire(), 0.5)
                return True
            except TimeoutError:
                if stop_opening():
                    return False

    try:
        for _ in range(plan.idle):
            if time.perf_counter() > deadline or not await slot():
                break
            result = Stream()
            results.append(result)
            tasks.append(asyncio.create_task(one(result)))
        while any(r.first_byte is None and r.error is None for r in results) and not stop_opening():
            await asyncio.sleep(0.2)
        established = [r for r in results if r.first_byte is not None and r.status == 200]
        opened_in = max((r.first_byte for r in established), default=start) - start
        log(f"  {target.title}: {len(established)} of {plan.idle} streams established in {opened_in:.1f} s"
            f"{' (stalled)' if stalled else ''}; holding for {2 * PING_INTERVAL + 0.5:g} s")

        hold_start, cpu0 = time.perf_counter(), cpu_seconds(pid)
        db_max = threads_max = 0
        db_files = 0
        while time.perf_counter() - hold_start < 2 * PING_INTERVAL + 0.5:
            threads_max = max(threads_max, proc_status(pid, "Threads"))
            if target.sqlite_file is not None:
                conns, files = sqlite_handles(pid, target.sqlite_file)
                db_max, db_files = max(db_max, conns), max(db_files, files)
            elif pg is not None and target.pg_db:
                db_max = max(db_max, await asyncio.to_thread(pg.connections, target.pg_db))
            await asyncio.sleep(0.5)
        hold = time.perf_counter() - hold_start
        rss1, cpu1 = proc_status(pid, "VmRSS"), cpu_seconds(pid)
        pinged = sum(1 for r in established if r.last_ping and r.last_ping >= hold_start)
        waiting = sum(1 for r in results if r.first_byte is None and r.error is None)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # Once the streams are gone: what the server still holds is its pool's (a fixed set of
    # threads, each keeping its connection, warmed by whatever ran meanwhile, e.g. the run
    # keeper's lease renewals); a connection that goes away with the streams was theirs.
    await wait_quiet([pid])
    db_after = 0
    if target.sqlite_file is not None:
        db_after = sqlite_handles(pid, target.sqlite_file)[0]
    elif pg is not None and target.pg_db:
        db_after = await asyncio.to_thread(pg.connections, target.pg_db)
    failed = [r for r in results if r.error or (r.status and r.status != 200)]
    cut_short = not stalled and len(established) + len(failed) < plan.idle  # the window ended first
    return {
        "asked": plan.idle, "established": len(established), "stalled": stalled, "cut_short": cut_short,
        "failed": len(failed), "waiting": waiting,
        "failures": sorted({(r.error or f"HTTP {r.status}")[:160] for r in failed})[:5],
        "opened_in": opened_in, "window": plan.idle_window,
        "rss0_kib": rss0, "rss1_kib": rss1,
        "kib_per_stream": (rss1 - rss0) / len(established) if established else None,
        "threads0": threads0, "threads": threads_max, "db_conns": db_max if target.dialect == "project" else None,
        "db_conns0": db0 if target.dialect == "project" else None,
        "db_conns_after": db_after if target.dialect == "project" else None,
        "db_conns_added": max(0, db_max - max(db0, db_after)) if target.dialect == "project" else None,
        "db_files": db_files, "pinged": pinged, "hold_cpu_pct": (cpu1 - cpu0) / hold * 100,
    }


# --- report ---------------------------------------------------------------------------------------

def fmt(value, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}{unit}"


def build_table(targets: list[Target], figures: dict[str, dict], plan: Plan) -> tuple[str, list[str]]:
    """The markdown table, and the targets the project missed."""
    projects = [t for t in targets if t.dialect == "project"]
    header = ["figure", "bare"] + [t.title for t in projects] + ["ratio (project / bare)", "target", "pass"]
    rows: list[list[str]] = []
    failed: list[str] = []

    def row(name: str, get, digits: int = 0, unit: str = "", test=None, target_text: str = "—", shown=None) -> None:
        values = {t.key: get(figures[t.key]) for t in targets}
        cells = [name] + [(shown or (lambda v, k: fmt(v, unit, digits)))(values[t.key], t.key) for t in targets]
        base = values["bare"]
        ratios = [f"{values[p.key] / base:.2f}×" if isinstance(base, (int, float)) and base and values[p.key] is not None
                  else "—" for p in projects]
        cells.append(" / ".join(ratios))
        cells.append(target_text)
        if test is None:
            cells.append("—")
        else:
            verdicts = []
            for p in projects:
                verdict = test(values[p.key], base, figures[p.key])
                verdicts.append("n/a" if verdict is None else ("PASS" if verdict else "FAIL"))
                if verdict is False:
                    failed.append(f"{p.title}: {name}")
            cells.append(" / ".join(verdicts))
        rows.append(cells)

    def ok(check):
        return lambda v, b, f: None if v is None or b is None else check(v, b)

    row("one stream, tokens/s (median)", lambda f: f["tps"], test=ok(lambda v, b: v >= 0.9 * b), target_text="≥ 0.9× bare")
    row(f"text frames per {FAST_DELTAS:,}-delta stream", lambda f: f["frames"])
    row("server CPU per relayed delta, µs", lambda f: f["cpu_us"], test=ok(lambda v, b: v <= 1.5 * b), target_text="≤ 1.5× bare")
    for c, _ in plan.ttfe:
        test, text = ((ok(lambda v, b: v <= b + 2), "≤ bare + 2 ms") if c == 1 else (ok(lambda v, b: v <= 1.25 * b), "≤ 1.25× bare"))
        row(f"time to first text delta, c={c}, p50 ms", lambda f, c=c: f["ttfe"][c].get("p50"), 1, test=test, target_text=text)
        row(f"time to first text delta, c={c}, p95 ms", lambda f, c=c: f["ttfe"][c].get("p95"), 1)
        row(f"server CPU per stream at c={c} (start to end, 20 deltas), ms", lambda f, c=c: f["ttfe"][c].get("cpu_ms"), 2)
    n = plan.idle

    def established(value, key):
        idle = figures[key]["idle"]
        text = f"stalled at {value:,}" if idle["stalled"] else (f"{value:,} in {idle['window']:g} s" if idle["cut_short"] else f"{value:,}")
        return text + (f", {idle['failed']:,} failed" if idle["failed"] else "")

    row(f"idle streams established (of {n:,})", lambda f: f["idle"]["established"], shown=established,
        test=lambda v, b, f: None if n < IDLE_TARGET else (v >= IDLE_TARGET and not f["idle"]["stalled"]),
        target_text=f"≥ {IDLE_TARGET:,}" + ("" if n >= IDLE_TARGET else f" (n/a: ran {n:,})"))
    row("server RSS per idle stream, KiB", lambda f: f["idle"]["kib_per_stream"], 1, test=ok(lambda v, b: v <= 2 * b),
        target_text="≤ 2× bare")
    row("DB connections held by the idle streams (open during, gone after they closed)", lambda f: f["idle"]["db_conns_added"],
        test=lambda v, b, f: None if v is None else v == 0, target_text="0")
    row("DB connections open in the server (its pool), before / during / after the idle streams",
        lambda f: f["idle"]["db_conns"], shown=lambda v, k: (
            "—" if v is None else f"{figures[k]['idle']['db_conns0']:,} / {v:,} / {figures[k]['idle']['db_conns_after']:,}"))
    row("server threads with the idle streams open", lambda f: f["idle"]["threads"])
    row("idle streams still receiving pings", lambda f: f["idle"]["pinged"])
    row("server CPU holding the idle streams, % of a core", lambda f: f["idle"]["hold_cpu_pct"], 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines), failed


def machine() -> dict[str, str]:
    meminfo = Path("/proc/meminfo").read_text()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    mem_kib = int(re.search(r"MemTotal:\s+(\d+)", meminfo)[1])
    return {"nproc": str(os.cpu_count()), "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
            "cpu": model[1].strip() if model else platform.processor() or "?",
            "kernel": f"{platform.system()} {platform.release()}"}


def versions() -> dict[str, str]:
    out = {"Python": platform.python_version()}
    for dist in ("django", "daphne", "twisted", "channels", "channels-redis", "anthropic", "httpx2", "psycopg"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def write_results(path: Path, *, label: str, started: datetime.datetime, seconds: float, command: str, table: str,
                  targets: list[Target], figures: dict[str, dict], plan: Plan, info: dict[str, str],
                  load: tuple[str, str], problems: list[str]) -> None:
    m, v = machine(), versions()
    lines = [
        f"# Streaming benchmark{': ' + label if label else ''}",
        "",
        f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')} ({seconds:.0f} s)",
        f"- Commit: `{git_commit()}`",
        f"- Command: `{command}`",
        f"- Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, {m['kernel']}; "
        f"load average {load[0]} at the start, {load[1]} at the end (other processes add noise)",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        *(f"- {k}: {val}" for k, val in info.items()),
        "",
        "Figures from `bench/stream_bench.py` (its docstring describes the method). Targets are the issue's;",
        "\"pass\" lists the project columns left to right.",
        "",
        table,
        "",
        "## Details",
        "",
    ]
    for target in targets:
        f = figures[target.key]
        idle = f.get("idle", {})
        lines += [f"**{target.title}**", ""]
        lines.append(f"- one stream: tokens/s per run {', '.join(f'{x:,.0f}' for x in f['tps_runs'])}; "
                     f"server CPU {f['cpu_s']:.2f} s for {plan.repeats} × {FAST_DELTAS:,} deltas")
        for c, per in plan.ttfe:
            t = f["ttfe"][c]
            if t.get("n"):
                lines.append(f"- first text delta at c={c}: {t['n']} streams ({per} rounds) in {t['wall']:.1f} s; "
                             f"p50 {t['p50']:.1f} ms, p95 {t['p95']:.1f} ms, max {t['max']:.1f} ms; "
                             f"server CPU {t['cpu_ms']:.2f} ms per stream")
        if idle:
            db = ""
            if target.sqlite_file is not None:
                db = f"; {idle['db_files']} file handles on the database and its -wal/-shm"
            lines.append(
                f"- idle: {idle['established']:,} of {idle['asked']:,} established"
                f"{' (stalled: none new for ' + format(plan.stall_after, 'g') + ' s)' if idle['stalled'] else ''}, "
                f"the last after {idle['opened_in']:.1f} s (window {idle['window']:g} s); {idle['failed']:,} failed, "
                f"{idle['waiting']:,} still waiting for a first byte during the hold (their memory counts too); "
                f"RSS {idle['rss0_kib'] / 1024:.1f} → {idle['rss1_kib'] / 1024:.1f} MiB; "
                f"threads {idle['threads0']} → {idle['threads']}{db}")
            for failure in idle["failures"]:
                lines.append(f"  - as the client saw a failure: `{failure}`")
        for count, line in f.get("log_errors", []):
            lines.append(f"- in the server's log, {count:,} ×: `{line}`")
        lines.append("")
    lines += [
        "`bench/run_stream.py`, kept beside this benchmark, is the older in-process measurement of the run",
        "service alone (mock engine, no HTTP); it is not part of these figures.",
        "",
    ]
    if problems:
        lines += ["## Wrong output", "", "Streams whose content or ending was not what the upstream sent (the run exits 1):", ""]
        lines += [f"- {p}" for p in problems[:50]] + [""]
    path.write_text("\n".join(lines))


# --- main -----------------------------------------------------------------------------------------

async def bench(args: argparse.Namespace, workdir: Path, servers: Servers) -> int:
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = f"{os.getloadavg()[0]:.2f}"
    plan = QUICK if args.quick else FULL
    if args.idle is not None:
        plan = Plan(plan.repeats, plan.ttfe, args.idle, plan.idle_window, plan.stall_after)
    info: dict[str, str] = {}
    pg = None
    if not args.skip_postgres:
        try:
            pg = Postgres()
            info["PostgreSQL"] = (f"{pg.version} (max_connections {pg.max_connections}); the project uses database and "
                                  f"role `{PG_DB}`, limited to {pg.role_limit} connections")
            info["Redis"] = f"{redis_version()}, `{REDIS_URL}`"
        except Exception as exc:  # noqa: BLE001 - any failure to reach them means the same advice
            raise BenchError(f"PostgreSQL or Redis on {HOST} does not answer ({exc}); run with --skip-postgres") from exc
    problems: list[str] = []
    try:
        log("starting the fake upstream, the bare relay and the project")
        upstream_port = await start_upstream(servers)
        env = base_env(upstream_port)
        targets = [Target("bare", "bare", free_port(), "/relay", "bare")]
        servers.spawn("bare", [sys.executable, "-m", "daphne", "-b", HOST, "-p", str(targets[0].port), "bench.bare_relay:app"],
                      {**env, "PYTHONPATH": str(REPO)})
        sqlite = Target("sqlite", "project (SQLite)", free_port(), "/v1/agent/chat", "project",
                        sqlite_file=workdir / "bench.sqlite3")
        project_envs = {"sqlite": {**env, "DATABASE_URL": f"sqlite:///{sqlite.sqlite_file}", "WORKSPACES_ROOT": str(workdir / "ws-sqlite")}}
        targets.append(sqlite)
        if pg is not None:
            targets.append(Target("pg", "project (PG+Redis)", free_port(), "/v1/agent/chat", "project", pg_db=PG_DB))
            project_envs["pg"] = {**env, "DATABASE_URL": pg.recreate(PG_DB),
                                  "REDIS_URL": REDIS_URL, "WORKSPACES_ROOT": str(workdir / "ws-pg")}
        await asyncio.gather(
            wait_listening(servers, "bare", targets[0].port, None, limit=30),
            *(start_project(servers, t, project_envs[t.key]) for t in targets if t.dialect == "project"))
        for target in targets:
            target.proc = servers.procs[target.key]
        info["Open-files limit"] = ", ".join(f"{t.title} {open_files_limit(t.pid)}" for t in targets) + \
            f", client {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
        log("servers up: " + ", ".join(f"{t.title} pid {t.pid} port {t.port}" for t in targets))

        for target in targets:
            await warm_up(target, problems)
        if problems:
            raise BenchError("wrong output while warming up:\n" + "\n".join(problems))
        figures: dict[str, dict] = {}
        log(f"one stream of {FAST_DELTAS:,} deltas, {plan.repeats} runs per server")
        figures.update(await one_stream(targets, plan.repeats, problems))
        for target in targets:
            figures[target.key]["ttfe"] = {}
        for c, per in plan.ttfe:
            log(f"first text delta at c={c}: {per} rounds per server, taking turns")
            for key, result in (await first_delta_times(targets, c, per, problems)).items():
                figures[key]["ttfe"][c] = result
                if result["n"]:
                    log(f"  {key}: p50 {result['p50']:.1f} ms, p95 {result['p95']:.1f} ms")
        for target in targets:
            log(f"idle streams: {target.title}")
            servers.check_alive(target.key)
            figures[target.key]["idle"] = await idle_streams(target, plan, pg)
            servers.stop(target.key, grace=1)
            figures[target.key]["log_errors"] = servers.log_errors(target.key)
        table, failed = build_table(targets, figures, plan)
    finally:
        if pg is not None:
            pg.close()
    print(table)
    if failed:
        print("\nTargets missed: " + "; ".join(failed))
    if problems:
        print(f"\nWrong output in {len(problems)} stream(s):\n" + "\n".join(problems[:20]), file=sys.stderr)
    seconds = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).as_posix(), *sys.argv])
    load_end = f"{os.getloadavg()[0]:.2f}"
    write_results(args.output, label=args.label, started=started, seconds=seconds, command=command, table=table,
                  targets=targets, figures=figures, plan=plan, info=info, load=(load_start, load_end),
                  problems=problems)
    log(f"wrote {args.output} ({seconds:.0f} s in all)")
    return 1 if problems else 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description="Streaming benchmark: the project beside a bare relay (see the module docstring).")
    parser.add_argument("--quick", action="store_true", help="fewer samples and idle streams (about 1.5 minutes)")
    parser.add_argument("--skip-postgres", action="store_true", help="measure the project on SQLite only")
    parser.add_argument("--idle", type=int, help=f"idle streams to open (default {FULL.idle:,}; {QUICK.idle} with --quick)")
    parser.add_argument("--label", default="", help="a heading for RESULTS.md, e.g. 'before'")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "RESULTS.md", help="where to write the results")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 3 * max(args.idle or FULL.idle, 1) + 1000:
        print(f"the open-files hard limit ({hard}) is too low for {args.idle or FULL.idle} idle streams", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="stream-bench-"))
    servers = Servers(workdir)
    keep = True
    try:
        status = asyncio.run(bench(args, workdir, servers))
        keep = status != 0
        return status
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        servers.stop_all()
        if keep:
            print(f"server logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
