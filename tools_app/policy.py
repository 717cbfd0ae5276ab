"""Approval policy: which tool calls run at once, which wait for a person, which are refused.

Everything here is pure (no database, no file system): the rules come in as arguments, so the
evaluation is unit-testable and every transport gets the same answer from the same function.

A rule is ``(effect, tool pattern, argument pattern, scope)``:

- ``effect``: ``allow`` (run without asking), ``ask`` (a person approves each call) or ``deny``
  (refused; the model is told which rule refused it);
- ``tool``: a tool name or an fnmatch-style glob (``bash``, ``mcp__filesystem__*``);
- ``argument``: optional pattern on the tool's main argument (see :data:`TOOL_ARGUMENTS`);
  blank matches any call of the tool;
- ``scope``: ``global`` (admins), ``agent`` or ``conversation``.

Evaluation (:func:`policy_evaluate`): if any ``deny`` rule matches, the call is denied; else if
any ``ask`` rule matches, a person is asked; else if any ``allow`` rule matches, it runs; else
the tool's own default applies (:func:`tool_default_effect`). The effect order always wins over
scope: a conversation ``allow`` does not lift an admin's ``ask``. Among matching rules of the
winning effect, the most specific scope (conversation, then agent, then global) names the rule
that is reported; then a rule with an argument pattern before one without, then the oldest.

Argument patterns are read per kind, through a registry (tool name → input key and kind), and
match asymmetrically so that a pattern can only make a rule *safer* than it looks:

- ``command`` (``bash``): a glob on the command line (``git status*``). An ``allow`` pattern
  never matches a command containing shell control syntax (``;`` ``&&`` ``||`` ``|`` ``&``
  backtick ``$(`` ``>`` ``<`` newline), so ``git status; rm -rf ~`` falls through to ask. A
  ``deny``/``ask`` pattern matches if *any* simple command in the line (split on those
  operators, leading ``VAR=value`` assignments and wrappers such as ``sudo``/``env``/``xargs``
  dropped, ``/bin/rm`` also tried as ``rm``) matches. This is a guard rail, not a sandbox:
  quoting, variables, ``eval`` or ``bash -c`` can hide a command from a deny pattern.
- ``path`` (``read_file``, ``write_file``): a glob relative to the workspace (``src/**``,
  ``**/*.py``, ``*`` stays inside one directory, ``**`` crosses directories, dot-files
  included). The called path is normalised first (``..`` collapsed, an absolute path inside the
  workspace made relative); a path that escapes the workspace never matches any rule, so it
  never gets an ``allow`` (the tool refuses it anyway).
- ``host`` (``web_fetch``): the host of the URL, case-insensitive; ``*.example.com`` matches
  any subdomain, not ``example.com`` itself. Redirects are not re-checked against the rules.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol
from urllib.parse import urlsplit


class Effect:
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"
    # Evaluation order: the first effect with a matching rule decides.
    ORDER = (DENY, ASK, ALLOW)
    ALL = frozenset(ORDER)


class Scope:
    GLOBAL = "global"
    AGENT = "agent"
    CONVERSATION = "conversation"
    # Most specific first: names the reported rule among matches of one effect.
    PRECEDENCE = (CONVERSATION, AGENT, GLOBAL)
    ALL = frozenset(PRECEDENCE)


TOOL_PATTERN_MAX = 100
ARGUMENT_MAX = 500
NAME_MAX = 200


class Rule(Protocol):
    """What the evaluation reads from a rule; ``ToolRule`` rows and :class:`PolicyRule` both fit."""

    id: int | None
    effect: str
    tool: str
    argument: str
    scope: str
    name: str


@dataclass(frozen=True)
class PolicyRule:
    effect: str
    tool: str
    argument: str = ""
    scope: str = Scope.GLOBAL
    name: str = ""
    id: int | None = None


@dataclass(frozen=True)
class PolicyDecision:
    effect: str
    # The rule's name, or "default for <tool>" when no rule matched.
    rule: str
    rule_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``policy`` object carried by ``tool.state``."""
        return {"effect": self.effect, "rule": self.rule, "ruleId": self.rule_id}


def rule_label(rule: Rule) -> str:
    return rule.name or rule_default_name(scope=rule.scope, rule_id=rule.id, effect=rule.effect,
                                          tool=rule.tool, argument=rule.argument)


def rule_default_name(*, scope: str, rule_id: int | None, effect: str, tool: str, argument: str = "") -> str:
    """E.g. ``conversation rule #12: allow bash git status*``."""
    text = f"{scope} rule #{rule_id}: {effect} {tool}"
    return f"{text} {argument}" if argument else text


def tool_default_effect(tool: Any) -> str:
    """A tool's own default: ``ask`` when it (or its MCP server config) requires approval, or when
    the tool is unknown; ``allow`` otherwise."""
    if tool is None:
        return Effect.ASK
    return Effect.ASK if getattr(tool, "requires_approval", True) else Effect.ALLOW


# --- argument kinds ------------------------------------------------------------------------------

_CONTROL = re.compile(r"[;&|`<>\n\r]|\$\(")
_SPLIT = re.compile(r"&&|\|\||[;&|`<>()\n\r]|\$\(")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Words that run the command after them: a deny on "rm *" must see "sudo rm -rf x" too.
_WRAPPERS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "do", "while", "until", "time", "exec",
                       "command", "builtin", "nohup", "sudo", "doas", "env", "nice", "xargs", "timeout", "stdbuf"})
_WRAPPER_ARGUMENT = re.compile(r"^(-.*|\d+(\.\d+)?[smhd]?)$")
_CONTROL_TEXT = "; && || | & ` $( > < or a line break"


def _command_extract(raw: Any, workspace: Path | str | None) -> str | None:
    return raw.strip() if isinstance(raw, str) and raw.strip() else None


def _simple_commands(command: str) -> list[str]:
    """Each simple command of a line in a normalised form (and ``/bin/rm`` also as ``rm``)."""
    forms: list[str] = []
    for segment in _SPLIT.split(command):
        words = segment.split()
        while words and (words[0] in _WRAPPERS or _ASSIGNMENT.match(words[0])):
            if words.pop(0) in _WRAPPERS:
                while words and _WRAPPER_ARGUMENT.match(words[0]):  # "-n", "5", "10s": the wrapper's own
                    words.pop(0)
        if not words:
            continue
        forms.append(" ".join(words))
        head = words[0].lstrip("\\").rsplit("/", 1)[-1]
        if head and head != words[0]:
            forms.append(" ".join([head, *words[1:]]))
    return forms


def _command_matches(pattern: str, command: str, effect: str) -> bool:
    if effect == Effect.ALLOW:
        # Anything chained, piped, substituted or redirected is more than the pattern promises.
        return not _CONTROL.search(command) and fnmatchcase(command, pattern.strip())
    normalised = " ".join(pattern.split())
    return any(fnmatchcase(form, normalised) for form in _simple_commands(command))


def _command_problem(pattern: str) -> str | None:
    if _CONTROL.search(pattern):
        return (f"A bash pattern cannot contain shell control syntax ({_CONTROL_TEXT}): allow rules never "
                "match such commands, and deny/ask rules match each simple command on its own.")
    return None


def normalise_path(raw: Any, workspace: Path | str | None) -> str | None:
    """The workspace-relative, ``..``-collapsed form of a path argument; None when it is not a
    usable path or escapes the workspace. Lexical only (the tool itself resolves symlinks)."""
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        return None
    if raw.startswith("/"):
        if workspace is None:
            return None
        root = posixpath.normpath(str(workspace))
        full = posixpath.normpath(raw)
        if full == root:
            return "."
        if not full.startswith(root.rstrip("/") + "/"):
            return None
        return full[len(root.rstrip("/")) + 1:]
    relative = posixpath.normpath(raw)
    if relative == ".." or relative.startswith("../"):
        return None
    return relative


def _path_regex(pattern: str) -> re.Pattern[str]:
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    out = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]*/)*")
        else:
            out.append(_segment_regex(part) + ("" if last else "/"))
    return re.compile("".join(out))


def _segment_regex(segment: str) -> str:
    """One path segment's glob: ``*``, ``?`` and ``[...]`` never match a ``/``."""
    out, i, n = [], 0, len(segment)
    while i < n:
        char = segment[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (end := _class_end(segment, i)) is not None:
            body = segment[i + 1:end].replace("\\", "\\\\")
            if body.startswith("!"):
                body = "^" + body[1:]
            elif body.startswith("^"):
                body = "\\" + body
            out.append(f"(?:(?!/)[{body}])")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def _class_end(segment: str, start: int) -> int | None:
    """Index of the ``]`` closing the class opened at ``start`` (fnmatch's rules), or None."""
    j = start + 1
    if j < len(segment) and segment[j] == "!":
        j += 1
    if j < len(segment) and segment[j] == "]":
        j += 1
    while j < len(segment) and segment[j] != "]":
        j += 1
    return j if j < len(segment) else None


def _path_matches(pattern: str, path: str, effect: str) -> bool:
    return bool(_path_regex(pattern).fullmatch(path))


def _path_problem(pattern: str) -> str | None:
    stripped = pattern.strip()
    if stripped.startswith("/") or stripped.startswith("~"):
        return "A path pattern is relative to the agent's workspace (e.g. src/** or **/*.py), not absolute."
    if ".." in stripped.split("/"):
        return "A path pattern cannot contain '..': paths outside the workspace never match a rule."
    if "\\" in stripped:
        return "A path pattern uses '/' between directories, not '\\'."
    if not [part for part in stripped.split("/") if part not in ("", ".")]:
        return "A path pattern names files inside the workspace, e.g. src/** or **/*.py."
    return None


def _host_extract(raw: Any, workspace: Path | str | None) -> str | None:
    if not isinstance(raw, str):
        return None
    url = raw.strip()  # as web_fetch does before checking the URL
    if not url or any(c in url for c in "\\ \t\r\n\x00"):
        return None  # parsers disagree on such URLs: no host, so no rule with a host pattern matches
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not host:
        return None
    return host.rstrip(".") or None


_HOST_PATTERN = re.compile(r"^(\*\.)?[a-z0-9_:-]+(\.[a-z0-9_:-]+)*$")


def _host_matches(pattern: str, host: str, effect: str) -> bool:
    pattern = pattern.strip().lower().rstrip(".")
    if pattern.startswith("*."):
        suffix = pattern[1:]
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def _host_problem(pattern: str) -> str | None:
    if not _HOST_PATTERN.match(pattern.strip().lower().rstrip(".")):
        return "A host pattern is a host name (docs.python.org) or *. and a domain (*.example.com), without scheme or path."
    return None


@dataclass(frozen=True)
class ArgumentKind:
    name: str
    # (raw input value, workspace) → the value rules see, or None when there is none to match.
    extract: Callable[[Any, Path | str | None], str | None]
    # (pattern, extracted value, rule effect) → does the rule match?
    matches: Callable[[str, str, str], bool]
    # pattern → why it is not acceptable, or None.
    problem: Callable[[str], str | None]


ARGUMENT_KINDS: dict[str, ArgumentKind] = {
    kind.name: kind for kind in (
        ArgumentKind("command", _command_extract, _command_matches, _command_problem),
        ArgumentKind("path", normalise_path, _path_matches, _path_problem),
        ArgumentKind("host", _host_extract, _host_matches, _host_problem),
    )
}

# Tool name → (input key of its main argument, argument kind). Tools not listed have none: a rule
# for them cannot carry an argument pattern.
TOOL_ARGUMENTS: dict[str, tuple[str, str]] = {
    "bash": ("command", "command"),
    "read_file": ("path", "path"),
    "write_file": ("path", "path"),
    "web_fetch": ("url", "host"),
}


def register_tool_argument(tool: str, *, key: str, kind: str) -> None:
    """Let rules match ``tool``'s ``key`` input as a ``command``, ``path`` or ``host``."""
    if kind not in ARGUMENT_KINDS:
        raise ValueError(f"unknown argument kind {kind!r}; use one of: {', '.join(ARGUMENT_KINDS)}")
    TOOL_ARGUMENTS[tool] = (key, kind)


def _argument_of(tool_name: str, tool_input: Any, workspace: Path | str | None) -> tuple[ArgumentKind, str | None] | None:
    entry = TOOL_ARGUMENTS.get(tool_name)
    if entry is None:
        return None
    key, kind_name = entry
    kind = ARGUMENT_KINDS[kind_name]
    raw = tool_input.get(key) if isinstance(tool_input, dict) else None
    return kind, kind.extract(raw, workspace)


# --- evaluation ----------------------------------------------------------------------------------

def _matches(rule: Rule, tool_name: str, argument: tuple[ArgumentKind, str | None] | None) -> bool:
    if not fnmatchcase(tool_name, rule.tool):
        return False
    if not rule.argument:
        return True
    if argument is None or argument[1] is None:
        return False  # no argument to compare (or a path outside the workspace): the pattern cannot match
    kind, value = argument
    return kind.matches(rule.argument, value, rule.effect)


def rule_matches(*, rule: Rule, tool_name: str, tool_input: Any, workspace: Path | str | None = None) -> bool:
    return _matches(rule, tool_name, _argument_of(tool_name, tool_input, workspace))


def _specificity(rule: Rule) -> tuple[int, int, int]:
    scope_rank = Scope.PRECEDENCE.index(rule.scope) if rule.scope in Scope.ALL else len(Scope.PRECEDENCE)
    return scope_rank, 0 if rule.argument else 1, rule.id if rule.id is not None else 0


def policy_evaluate(*, tool_name: str, tool_input: Any, rules: Iterable[Rule], default_effect: str,
                    workspace: Path | str | None = None) -> PolicyDecision:
    """Decide one tool call: deny, then ask, then allow; the tool's default when no rule matches.

    Args:
        workspace: the agent's workspace (its real path), for normalising path arguments.
    """
    if default_effect not in Effect.ALL:
        raise ValueError(f"unknown default effect {default_effect!r}")
    argument = _argument_of(tool_name, tool_input, workspace)
    matching = [rule for rule in rules if rule.effect in Effect.ALL and _matches(rule, tool_name, argument)]
    for effect in Effect.ORDER:
        candidates = [rule for rule in matching if rule.effect == effect]
        if candidates:
            best = min(candidates, key=_specificity)
            return PolicyDecision(effect=effect, rule=rule_label(best), rule_id=best.id)
    return PolicyDecision(effect=default_effect, rule=f"default for {tool_name}")


def policy_allows_unconditionally(*, tool_name: str, rules: Iterable[Rule], default_effect: str) -> bool:
    """True when every call of the tool runs without a person, whatever its arguments.

    For engines that hand tools to something that cannot pause for a person (the Claude Code CLI):
    a tool is only given to it when no deny or ask rule could apply to any of its calls.
    """
    rules = list(rules)
    if any(r.argument and r.effect != Effect.ALLOW and fnmatchcase(tool_name, r.tool) for r in rules):
        return False
    decision = policy_evaluate(tool_name=tool_name, tool_input={}, rules=rules, default_effect=default_effect)
    return decision.effect == Effect.ALLOW


# --- validation ----------------------------------------------------------------------------------

_TOOL_PATTERN = re.compile(r"^[a-z0-9_*?\[\]!-]+$")


def rule_problems(*, effect: Any, tool: Any, argument: Any, scope: Any, agent_id: Any, conversation_id: Any,
                  name: Any = "") -> dict[str, str]:
    """What is wrong with a rule, by field (empty when it is fine). Used by the model and the services."""
    problems: dict[str, str] = {}
    if effect not in Effect.ALL:
        problems["effect"] = "effect must be allow, ask or deny."
    if scope not in Scope.ALL:
        problems["scope"] = "scope must be global, agent or conversation."
    elif scope == Scope.GLOBAL and (agent_id is not None or conversation_id is not None):
        problems["scope"] = "A global rule names no agent and no conversation."
    elif scope == Scope.AGENT and (agent_id is None or conversation_id is not None):
        problems["agent"] = "An agent rule names its agent (and no conversation)."
    elif scope == Scope.CONVERSATION and (conversation_id is None or agent_id is not None):
        problems["conversation_id"] = "A conversation rule names its conversation (and no agent)."
    if not isinstance(tool, str) or not tool:
        problems["tool"] = "tool is a tool name or glob, e.g. bash or mcp__filesystem__*."
    elif len(tool) > TOOL_PATTERN_MAX:
        problems["tool"] = f"tool is at most {TOOL_PATTERN_MAX} characters."
    elif not _TOOL_PATTERN.match(tool) or tool.count("[") != tool.count("]"):
        problems["tool"] = ("tool is a lower-case tool name or glob (letters, digits, _, and * ? [...]), "
                            "e.g. bash or mcp__filesystem__*.")
    if not isinstance(argument, str):
        problems["argument"] = "argument must be a string (blank matches any call)."
    elif argument:
        problem = _argument_problem(argument, tool if "tool" not in problems else None)
        if problem:
            problems["argument"] = problem
    if not isinstance(name, str) or len(name) > NAME_MAX:
        problems["name"] = f"name is a string of at most {NAME_MAX} characters."
    return problems


def _argument_problem(argument: str, tool: str | None) -> str | None:
    if len(argument) > ARGUMENT_MAX:
        return f"argument is at most {ARGUMENT_MAX} characters."
    if not argument.strip():
        return "argument must not be only spaces (leave it blank to match any call)."
    if any(ord(c) < 32 or ord(c) == 127 for c in argument):
        return "argument must not contain control characters or line breaks."
    if tool is None:
        return None
    kinds = {kind for name, (_, kind) in TOOL_ARGUMENTS.items() if fnmatchcase(name, tool)}
    if not kinds:
        listed = ", ".join(sorted(TOOL_ARGUMENTS))
        return f"{tool} has no main argument to match; argument patterns work for {listed}."
    for kind in sorted(kinds):
        problem = ARGUMENT_KINDS[kind].problem(argument)
        if problem:
            return problem
    return None
