"""Workspace confinement: every model-supplied path must stay under the workspace's real path."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools_app.registry import ToolError
from tools_app.workspace import display_path, ensure_workspace, resolve_in_workspace


def test_ensure_workspace_creates_directory(tmp_path: Path) -> None:
    created = ensure_workspace(tmp_path / "a" / "b")
    assert created.is_dir()
    assert created == Path(os.path.realpath(tmp_path / "a" / "b"))


def test_resolve_in_workspace_relative_path(workspace: Path) -> None:
    assert resolve_in_workspace(workspace, "notes/today.txt") == workspace / "notes" / "today.txt"


def test_resolve_in_workspace_absolute_path_inside_is_allowed(workspace: Path) -> None:
    assert resolve_in_workspace(workspace, str(workspace / "x.txt")) == workspace / "x.txt"


def test_resolve_in_workspace_dotdot_that_stays_inside_is_allowed(workspace: Path) -> None:
    assert resolve_in_workspace(workspace, "a/../b.txt") == workspace / "b.txt"


@pytest.mark.parametrize("path", ["../outside/secret.txt", "a/../../outside/secret.txt", "..", "./../../etc/passwd"])
def test_resolve_in_workspace_refuses_dotdot_escape(workspace: Path, outside: Path, path: str) -> None:
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve_in_workspace(workspace, path)


def test_resolve_in_workspace_refuses_absolute_path_outside(workspace: Path, outside: Path) -> None:
    for path in ("/etc/passwd", str(outside / "secret.txt"), "/"):
        with pytest.raises(ToolError, match="outside the workspace"):
            resolve_in_workspace(workspace, path)


def test_resolve_in_workspace_refuses_symlinked_file_pointing_out(workspace: Path, outside: Path) -> None:
    (workspace / "innocent.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        resolve_in_workspace(workspace, "innocent.txt")


def test_resolve_in_workspace_refuses_symlinked_directory_on_the_way_out(workspace: Path, outside: Path) -> None:
    (workspace / "docs").symlink_to(outside, target_is_directory=True)
    for path in ("docs/secret.txt", "docs/new-file.txt", "docs"):
        with pytest.raises(ToolError, match="outside the workspace"):
            resolve_in_workspace(workspace, path)


def test_resolve_in_workspace_allows_symlink_within_workspace(workspace: Path) -> None:
    (workspace / "real.txt").write_text("hi")
    (workspace / "alias.txt").symlink_to(workspace / "real.txt")
    assert resolve_in_workspace(workspace, "alias.txt", must_exist=True) == workspace / "real.txt"


def test_resolve_in_workspace_refuses_dangling_symlink(workspace: Path, outside: Path) -> None:
    (workspace / "to-inside").symlink_to(workspace / "not-yet")
    (workspace / "to-outside").symlink_to(outside / "not-yet")
    (workspace / "dir-link").symlink_to(workspace / "missing-dir", target_is_directory=True)
    with pytest.raises(ToolError, match="dangling symlink"):
        resolve_in_workspace(workspace, "to-inside")
    with pytest.raises(ToolError):
        resolve_in_workspace(workspace, "to-outside")
    with pytest.raises(ToolError, match="dangling symlink"):
        resolve_in_workspace(workspace, "dir-link/file.txt")


def test_resolve_in_workspace_follows_workspace_that_is_itself_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real-ws"
    real.mkdir()
    link = tmp_path / "ws-link"
    link.symlink_to(real, target_is_directory=True)
    assert resolve_in_workspace(link, "f.txt") == Path(os.path.realpath(real)) / "f.txt"
    assert resolve_in_workspace(link, str(link / "f.txt")) == Path(os.path.realpath(real)) / "f.txt"


@pytest.mark.parametrize("path", ["", "   ", "a\x00b", None, 3])
def test_resolve_in_workspace_refuses_empty_nul_and_non_string(workspace: Path, path: object) -> None:
    with pytest.raises(ToolError):
        resolve_in_workspace(workspace, path)  # type: ignore[arg-type]


def test_resolve_in_workspace_must_exist(workspace: Path) -> None:
    with pytest.raises(ToolError, match="no such file"):
        resolve_in_workspace(workspace, "missing.txt", must_exist=True)
    (workspace / "here.txt").write_text("x")
    assert resolve_in_workspace(workspace, "here.txt", must_exist=True).is_file()


def test_display_path_is_workspace_relative(workspace: Path) -> None:
    assert display_path(workspace, workspace / "a" / "b.txt") == "a/b.txt"
    assert display_path(workspace, workspace) == "."
