"""run_subprocess: scrubbed env, merged and capped output, process-group kill on timeout/cancel."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tools_app.sandbox import OutputCollector, run_subprocess, subprocess_env, truncate_text


@pytest.mark.asyncio
async def test_run_subprocess_merges_stdout_and_stderr(workspace: Path) -> None:
    result = await run_subprocess(
        ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], cwd=workspace, timeout=5, output_limit=1000
    )
    assert result.exit_code == 3
    assert "out\n" in result.output and "err\n" in result.output
    assert not result.timed_out and not result.truncated


@pytest.mark.asyncio
async def test_run_subprocess_passes_stdin(workspace: Path) -> None:
    result = await run_subprocess(["/bin/cat"], cwd=workspace, timeout=5, output_limit=1000, stdin=b"piped in")
    assert result.output == "piped in"
    assert result.exit_code == 0


@pytest.mark.asyncio
async def test_run_subprocess_truncates_large_output_without_blocking(workspace: Path) -> None:
    # 5 MB is far beyond a pipe buffer: the child only finishes if the rest is read and dropped.
    result = await run_subprocess(
        ["/bin/sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' a"], cwd=workspace, timeout=10, output_limit=1000
    )
    assert result.exit_code == 0 and not result.timed_out
    assert result.truncated
    assert result.output == "a" * 1000 + "\n[output truncated: 4999000 more characters]"


@pytest.mark.asyncio
async def test_run_subprocess_timeout_kills_process_group(workspace: Path, process_helpers: SimpleNamespace) -> None:
    started = time.monotonic()
    result = await run_subprocess(
        ["/bin/bash", "-c", "sleep 60 & echo child=$!; wait"], cwd=workspace, timeout=1, output_limit=1000
    )
    assert result.timed_out
    assert time.monotonic() - started < 5
    child = int(result.output.split("child=")[1].split()[0])
    assert process_helpers.wait_for(lambda: not process_helpers.pid_alive(child), timeout=5)


@pytest.mark.asyncio
async def test_run_subprocess_kills_background_children_when_main_exits(
    workspace: Path, process_helpers: SimpleNamespace
) -> None:
    started = time.monotonic()
    result = await run_subprocess(["/bin/bash", "-c", "sleep 60 & echo child=$!"], cwd=workspace, timeout=10, output_limit=1000)
    assert not result.timed_out and result.exit_code == 0
    assert time.monotonic() - started < 5  # did not wait for the background sleep's pipe
    child = int(result.output.split("child=")[1].split()[0])
    assert process_helpers.wait_for(lambda: not process_helpers.pid_alive(child), timeout=5)


@pytest.mark.asyncio
async def test_run_subprocess_cancellation_kills_process_group(workspace: Path, process_helpers: SimpleNamespace) -> None:
    task = asyncio.create_task(
        run_subprocess(
            ["/bin/bash", "-c", "echo $$ > leader.pid; sleep 60 & echo $! > child.pid; wait"],
            cwd=workspace,
            timeout=30,
            output_limit=1000,
        )
    )
    child_file = workspace / "child.pid"
    assert await process_helpers.async_wait_for(lambda: child_file.exists() and child_file.read_text().strip() != "")
    leader = int((workspace / "leader.pid").read_text())
    child = int(child_file.read_text())
    assert process_helpers.pid_alive(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await process_helpers.async_wait_for(lambda: not process_helpers.pid_alive(child))
    assert await process_helpers.async_wait_for(lambda: not process_helpers.pid_alive(leader))


def test_subprocess_env_only_allowlisted(monkeypatch: pytest.MonkeyPatch, workspace: Path, tool_settings: dict[str, Any]) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-leak")
    monkeypatch.setenv("LANG", "C.UTF-8")
    tool_settings["TOOL_ENV_ALLOWLIST"] = ["PATH", "LANG", "LC_ALL", "TZ"]
    env = subprocess_env(workspace)
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "PYTHONDONTWRITEBYTECODE"}
    assert env["HOME"] == str(workspace) and env["LANG"] == "C.UTF-8" and env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_output_collector_counts_multibyte_characters() -> None:
    collector = OutputCollector(3)
    data = "héllo wörld".encode()
    for byte in data:  # split inside multi-byte sequences on purpose
        collector.feed(bytes([byte]))
    assert collector.text() == "hél\n[output truncated: 8 more characters]"


def test_truncate_text_marks_cut() -> None:
    assert truncate_text("abc", 5) == ("abc", False)
    assert truncate_text("abcdef", 2) == ("ab\n[output truncated: 4 more characters]", True)
