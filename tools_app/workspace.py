"""Confine model-supplied paths to an agent's workspace.

Every path a tool touches goes through :func:`resolve_in_workspace`, which resolves symlinks and
``..`` against the workspace's *real* path and refuses anything that ends up outside it. The
returned path is fully resolved, so callers open the checked location, not the one the model
typed. A process running in the workspace at the same time (``bash``) could still swap a checked
directory for a symlink between the check and the open; file tools narrow that window with
``O_NOFOLLOW`` on the final component, which is as far as path-level confinement goes.
"""
from __future__ import annotations

import os
from pathlib import Path

from .registry import ToolError


def ensure_workspace(path: Path | str) -> Path:
    """Create the workspace directory if needed and return its real path."""
    workspace = Path(path)
    workspace.mkdir(parents=True, exist_ok=True)
    return Path(os.path.realpath(workspace))


def resolve_in_workspace(workspace: Path | str, path: str, *, must_exist: bool = False) -> Path:
    """Resolve ``path`` (relative to the workspace, or absolute inside it) to a real path.

    Raises:
        ToolError: the path is empty, contains NUL, escapes the workspace (``..``, an absolute
            path elsewhere, a symlink or symlinked directory pointing out), goes through a
            dangling symlink, or does not exist while ``must_exist`` is set.
    """
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in path:
        raise ToolError("path must not contain NUL bytes")

    root = Path(os.path.realpath(workspace))
    lexical = root / path  # an absolute ``path`` replaces ``root`` here, which is what we want
    resolved = Path(os.path.realpath(lexical))
    if not resolved.is_relative_to(root):
        raise ToolError(f"path {path!r} is outside the workspace")

    _refuse_dangling_links(lexical)

    if must_exist and not resolved.exists():
        raise ToolError(f"no such file or directory: {display_path(root, resolved)}")
    return resolved


def display_path(workspace: Path | str, resolved: Path) -> str:
    """The workspace-relative form of a resolved path, for messages shown to the model."""
    root = Path(os.path.realpath(workspace))
    try:
        relative = resolved.relative_to(root)
    except ValueError:
        return str(resolved)
    return str(relative) if str(relative) != "." else "."


def _refuse_dangling_links(lexical: Path) -> None:
    # A dangling link resolves "inside" today but creates its target wherever it points once
    # written through, and may be re-pointed later: refuse it at any depth of the path.
    current = Path(lexical.anchor)
    for part in lexical.parts[1:]:
        current = current / part
        if os.path.islink(current) and not os.path.exists(current):
            raise ToolError(f"path goes through a dangling symlink: {part!r}")
        if not os.path.lexists(current):
            return
