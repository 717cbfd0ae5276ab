"""read_file / write_file, and the registry listing of all built-in tools."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools_app.registry import ToolContext, all_tools, get_tool
from tools_app.tools.files import ReadFileTool, WriteFileTool


def test_registry_lists_every_builtin_tool() -> None:
    tools = all_tools()
    assert set(tools) >= {"bash", "read_file", "write_file", "web_fetch", "run_python", "mcp_filesystem", "mcp_trader"}
    approvals = {name: tools[name].requires_approval for name in tools}
    assert approvals["bash"] and approvals["write_file"] and approvals["run_python"] and approvals["mcp_trader"]
    assert not approvals["read_file"] and not approvals["web_fetch"] and not approvals["mcp_filesystem"]
    for name, cls in tools.items():
        spec = cls.spec()
        assert spec["name"] == name and spec["description"]
        assert spec["input_schema"]["type"] == "object" and spec["input_schema"]["required"]
        assert set(spec["input_schema"]["required"]) <= set(spec["input_schema"]["properties"])
    assert get_tool("read_file") is ReadFileTool


@pytest.mark.asyncio
async def test_read_file_returns_text(workspace: Path, context: ToolContext) -> None:
    (workspace / "notes.md").write_text("héllo\nworld\n", encoding="utf-8")
    result = await ReadFileTool().run(input={"path": "notes.md"}, context=context)
    assert not result.is_error
    assert result.output == "héllo\nworld\n"


@pytest.mark.asyncio
async def test_read_file_replaces_invalid_utf8(workspace: Path, context: ToolContext) -> None:
    (workspace / "bin.dat").write_bytes(b"ok \xff\xfe end")
    result = await ReadFileTool().run(input={"path": "bin.dat"}, context=context)
    assert not result.is_error
    assert result.output == "ok \ufffd\ufffd end"


@pytest.mark.asyncio
async def test_read_file_caps_output_with_marker(workspace: Path, context: ToolContext, tool_settings: dict[str, Any]) -> None:
    tool_settings["TOOL_OUTPUT_LIMIT"] = 10
    (workspace / "long.txt").write_text("0123456789" + "x" * 15)
    result = await ReadFileTool().run(input={"path": "long.txt"}, context=context)
    assert result.output == "0123456789\n[output truncated: 15 more characters]"
    assert result.metadata["truncated"] is True


@pytest.mark.asyncio
async def test_read_file_missing_directory_and_bad_input_are_errors(workspace: Path, context: ToolContext) -> None:
    (workspace / "sub").mkdir()
    missing = await ReadFileTool().run(input={"path": "nope.txt"}, context=context)
    directory = await ReadFileTool().run(input={"path": "sub"}, context=context)
    no_path = await ReadFileTool().run(input={}, context=context)
    assert missing.is_error and "no such file" in missing.output
    assert directory.is_error and "directory" in directory.output
    assert no_path.is_error and "'path'" in no_path.output


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["../outside/secret.txt", "leak.txt", "linked/secret.txt", "ABSOLUTE"])
async def test_read_file_refuses_escapes(workspace: Path, outside: Path, context: ToolContext, path: str) -> None:
    (workspace / "leak.txt").symlink_to(outside / "secret.txt")
    (workspace / "linked").symlink_to(outside, target_is_directory=True)
    if path == "ABSOLUTE":
        path = str(outside / "secret.txt")
    result = await ReadFileTool().run(input={"path": path}, context=context)
    assert result.is_error
    assert "outside the workspace" in result.output
    assert "TOP-SECRET" not in result.output


@pytest.mark.asyncio
async def test_write_file_creates_parent_directories(workspace: Path, context: ToolContext) -> None:
    result = await WriteFileTool().run(input={"path": "a/b/c.txt", "content": "hello"}, context=context)
    assert not result.is_error
    assert result.output == "OK: Wrote 5 chars to a/b/c.txt"
    assert (workspace / "a" / "b" / "c.txt").read_text() == "hello"


@pytest.mark.asyncio
async def test_write_file_overwrites_and_accepts_empty_content(workspace: Path, context: ToolContext) -> None:
    (workspace / "f.txt").write_text("old contents")
    result = await WriteFileTool().run(input={"path": str(workspace / "f.txt"), "content": ""}, context=context)
    assert result.output == "OK: Wrote 0 chars to f.txt"
    assert (workspace / "f.txt").read_text() == ""


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["../outside/new.txt", "ABSOLUTE", "linked/new.txt", "leak.txt", "linked/secret.txt"])
async def test_write_file_refuses_escapes(workspace: Path, outside: Path, context: ToolContext, path: str) -> None:
    (workspace / "leak.txt").symlink_to(outside / "secret.txt")
    (workspace / "linked").symlink_to(outside, target_is_directory=True)
    if path == "ABSOLUTE":
        path = str(outside / "new.txt")
    result = await WriteFileTool().run(input={"path": path, "content": "pwned"}, context=context)
    assert result.is_error
    assert "outside the workspace" in result.output
    assert not (outside / "new.txt").exists()
    assert (outside / "secret.txt").read_text() == "TOP-SECRET"


@pytest.mark.asyncio
async def test_write_file_refuses_dangling_symlink(workspace: Path, outside: Path, context: ToolContext) -> None:
    (workspace / "later.txt").symlink_to(outside / "created-later.txt")
    result = await WriteFileTool().run(input={"path": "later.txt", "content": "x"}, context=context)
    assert result.is_error
    assert not (outside / "created-later.txt").exists()


@pytest.mark.asyncio
async def test_write_file_bad_input_and_directory_target_are_errors(workspace: Path, context: ToolContext) -> None:
    (workspace / "sub").mkdir()
    no_content = await WriteFileTool().run(input={"path": "x.txt"}, context=context)
    to_dir = await WriteFileTool().run(input={"path": "sub", "content": "x"}, context=context)
    assert no_content.is_error and "'content'" in no_content.output
    assert to_dir.is_error and "directory" in to_dir.output
