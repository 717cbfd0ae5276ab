"""Run a subprocess for a tool: workspace cwd, scrubbed environment, timeout, output cap.

This is hygiene, not an OS sandbox: the child runs as the server's user and can read whatever
that user can. What it does guarantee:

- only allow-listed environment variables reach the child (no API keys, secret key, DB URLs);
- stdout and stderr are merged and kept up to a character limit, the rest is read and dropped
  so a chatty child never blocks on a full pipe;
- the child runs in its own session, and the whole process group is killed on timeout, on
  cancellation of the awaiting task, and when the main process exits (background jobs do not
  outlive the tool call). A grandchild that calls ``setsid`` itself escapes the group.
"""
from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Sequence

from . import conf

DEFAULT_ENV_ALLOWLIST = ["PATH", "LANG", "LC_ALL", "TZ"]
_FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"
# After the main process exits, how long lingering children may keep the pipe open before the
# group is killed; also how long to collect output already in the pipe after a kill.
DRAIN_GRACE = 0.5
_CHUNK = 65536


@dataclass(frozen=True)
class SubprocessResult:
    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool


def truncation_marker(more: int) -> str:
    return f"\n[output truncated: {more} more characters]"


class OutputCollector:
    """Decode bytes incrementally, keep the first ``limit`` characters, count the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, int(limit))
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []
        self._kept = 0
        self.dropped = 0

    def feed(self, data: bytes, *, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        room = self.limit - self._kept
        if room > 0:
            head = text[:room]
            self._parts.append(head)
            self._kept += len(head)
        self.dropped += max(0, len(text) - max(room, 0))

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        """Everything kept so far, with the truncation marker when something was dropped."""
        self.feed(b"", final=True)
        kept = "".join(self._parts)
        return kept + truncation_marker(self.dropped) if self.dropped else kept


def truncate_text(text: str, limit: int) -> tuple[str, bool]:
    """Cut ``text`` to ``limit`` characters, appending the truncation marker if it was longer."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + truncation_marker(len(text) - limit), True


def subprocess_env(workspace: Path | str) -> dict[str, str]:
    """The environment a tool subprocess gets: the allow-list, HOME=workspace, nothing else."""
    allow = conf.setting("TOOL_ENV_ALLOWLIST", DEFAULT_ENV_ALLOWLIST)
    env = {name: os.environ[name] for name in allow if name in os.environ}
    env.setdefault("PATH", _FALLBACK_PATH)
    env["HOME"] = str(workspace)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


async def run_subprocess(
    argv: Sequence[str],
    *,
    cwd: Path | str,
    timeout: float,
    output_limit: int,
    stdin: bytes | None = None,
) -> SubprocessResult:
    """Run ``argv`` in ``cwd`` and return its merged output, capped at ``output_limit`` chars.

    Cancelling the awaiting task kills the process group and re-raises ``CancelledError``.
    """
    loop = asyncio.get_running_loop()
    # Our own pipe rather than asyncio's: on Python 3.11 ``Process.wait()`` also waits for the
    # child's pipes to close, which a lingering background job would hold open indefinitely.
    read_fd, write_fd = os.pipe()
    try:
        with _stdin_file(stdin) as stdin_file:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=str(cwd),
                env=subprocess_env(cwd),
                stdin=stdin_file,
                stdout=write_fd,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)

    collector = OutputCollector(output_limit)
    stream = asyncio.StreamReader(limit=_CHUNK)
    pipe = open(read_fd, "rb", buffering=0)
    transport: asyncio.BaseTransport | None = None
    reader: asyncio.Task[None] | None = None
    timed_out = False
    try:
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), pipe)
        reader = asyncio.create_task(_pump(stream, collector))
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            timed_out = True
        else:
            await asyncio.wait({reader}, timeout=DRAIN_GRACE)
        _kill_group(proc)
        if timed_out:
            await proc.wait()
        if not reader.done():
            await asyncio.wait({reader}, timeout=DRAIN_GRACE)
    finally:
        # Also the cancellation path: nothing of ours keeps running. The child watcher reaps
        # the killed leader even if nobody awaits it.
        _kill_group(proc)
        if reader is not None:
            reader.cancel()
        if transport is not None:
            transport.close()
        else:
            pipe.close()
    return SubprocessResult(
        exit_code=proc.returncode,
        output=collector.text(),
        timed_out=timed_out,
        truncated=collector.truncated,
    )


@contextlib.contextmanager
def _stdin_file(data: bytes | None) -> Iterator[IO[bytes] | int]:
    # A file, not a pipe: no writer task, no deadlock if the child never reads it.
    if data is None:
        yield asyncio.subprocess.DEVNULL
        return
    with tempfile.TemporaryFile() as handle:
        handle.write(data)
        handle.seek(0)
        yield handle


async def _pump(stream: asyncio.StreamReader, collector: OutputCollector) -> None:
    while chunk := await stream.read(_CHUNK):
        collector.feed(chunk)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The group id is the child's pid (start_new_session). The id cannot be reused while any
    # member lives, so signalling it after the leader was reaped is still safe.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
