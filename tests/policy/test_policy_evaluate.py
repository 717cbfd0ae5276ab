"""``policy_evaluate``: effects, order, scope precedence and argument patterns (pure, no database)."""
from __future__ import annotations

import pytest

from tools_app.policy import (
    PolicyRule,
    normalise_path,
    policy_allows_unconditionally,
    policy_evaluate,
    rule_problems,
    tool_default_effect,
)

WORKSPACE = "/srv/workspaces/analyst"


def _rule(effect: str, tool: str, argument: str = "", scope: str = "global", id: int = 1, name: str = "") -> PolicyRule:
    return PolicyRule(effect=effect, tool=tool, argument=argument, scope=scope, id=id, name=name)


def _decide(tool: str, tool_input: dict, *rules: PolicyRule, default: str = "ask"):
    return policy_evaluate(tool_name=tool, tool_input=tool_input, rules=list(rules), default_effect=default,
                           workspace=WORKSPACE)


def _bash(command: str, *rules: PolicyRule) -> str:
    return _decide("bash", {"command": command}, *rules).effect


# --- effects, defaults, order --------------------------------------------------------------------

@pytest.mark.parametrize("effect", ["allow", "ask", "deny"])
def test_policy_evaluate_each_effect_decides_and_names_its_rule(effect):
    decision = _decide("bash", {"command": "ls"}, _rule(effect, "bash", id=7, name="my rule"))
    assert (decision.effect, decision.rule, decision.rule_id) == (effect, "my rule", 7)
    assert decision.to_dict() == {"effect": effect, "rule": "my rule", "ruleId": 7}


def test_policy_evaluate_no_rule_uses_the_tool_default():
    assert _decide("bash", {"command": "ls"}, default="ask").to_dict() == {
        "effect": "ask", "rule": "default for bash", "ruleId": None}
    assert _decide("read_file", {"path": "a"}, _rule("deny", "bash"), default="allow").effect == "allow"


def test_policy_evaluate_unnamed_rule_gets_a_generated_name():
    decision = _decide("bash", {"command": "git status"}, _rule("allow", "bash", "git status*", "conversation", id=12))
    assert decision.rule == "conversation rule #12: allow bash git status*"


def test_policy_evaluate_order_is_deny_then_ask_then_allow():
    allow, ask, deny = _rule("allow", "bash", id=1), _rule("ask", "bash", id=2), _rule("deny", "bash", id=3)
    assert _decide("bash", {"command": "ls"}, allow, ask, deny).effect == "deny"
    assert _decide("bash", {"command": "ls"}, allow, ask).effect == "ask"
    assert _decide("bash", {"command": "ls"}, allow).effect == "allow"


def test_policy_evaluate_effect_order_beats_scope():
    # A conversation allow does not lift a global ask; a conversation allow cannot undo a global deny.
    conversation_allow = _rule("allow", "bash", scope="conversation", id=1)
    assert _decide("bash", {"command": "ls"}, conversation_allow, _rule("ask", "bash", id=2)).effect == "ask"
    assert _decide("bash", {"command": "ls"}, conversation_allow, _rule("deny", "bash", id=3)).effect == "deny"


def test_policy_evaluate_most_specific_scope_wins_within_an_effect():
    rules = [_rule("allow", "bash", scope="global", id=1, name="global"),
             _rule("allow", "bash", scope="agent", id=2, name="agent"),
             _rule("allow", "bash", scope="conversation", id=3, name="conversation")]
    assert _decide("bash", {"command": "ls"}, *rules).rule == "conversation"
    assert _decide("bash", {"command": "ls"}, *rules[:2]).rule == "agent"
    assert _decide("bash", {"command": "ls"}, rules[0]).rule == "global"


def test_policy_evaluate_tool_globs():
    rule = _rule("deny", "mcp__filesystem__*")
    assert _decide("mcp__filesystem__write", {}, rule).effect == "deny"
    assert _decide("mcp__trader__buy", {}, rule).effect == "ask"
    assert _decide("bash", {"command": "ls"}, _rule("allow", "*")).effect == "allow"


def test_policy_evaluate_argument_pattern_on_a_tool_without_one_never_matches():
    assert _decide("run_python", {"code": "1"}, _rule("allow", "run_python", "1")).effect == "ask"


def test_tool_default_effect_from_the_tool():
    class Reader:
        requires_approval = False

    class Writer:
        requires_approval = True

    assert tool_default_effect(Reader()) == "allow"
    assert tool_default_effect(Writer()) == "ask"
    assert tool_default_effect(None) == "ask"  # unknown tools ask


# --- bash commands -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["git status", "git status --short", "  git status  "])
def test_policy_bash_allow_prefix_matches(command):
    assert _bash(command, _rule("allow", "bash", "git status*")) == "allow"


@pytest.mark.parametrize("command", [
    "git status; rm -rf ~", "git status && curl x | sh", "git status || true", "git status | tee x",
    "git status & sleep 1", "git status `rm x`", "git status $(rm x)", "git status > out.txt",
    "git status < in.txt", "git status\nrm -rf ~",
])
def test_policy_bash_allow_never_matches_shell_control_syntax(command):
    assert _bash(command, _rule("allow", "bash", "git status*")) == "ask"


def test_policy_bash_allow_does_not_match_other_commands():
    assert _bash("git push", _rule("allow", "bash", "git status*")) == "ask"


@pytest.mark.parametrize("command", [
    "rm -rf build", "echo hi; rm -rf build", "ls && rm -rf build", "true || rm -rf build", "ls | rm -rf build",
    "echo $(rm -rf build)", "echo `rm -rf build`", "sudo rm -rf build", "FOO=1 rm -rf build", "/bin/rm -rf build",
    "env -i rm -rf build", "timeout 10s rm -rf build", "nice -n 5 rm -rf build", "ls\nrm -rf build",
])
def test_policy_bash_deny_matches_any_simple_command(command):
    assert _bash(command, _rule("deny", "bash", "rm *"), _rule("allow", "bash")) == "deny"


def test_policy_bash_deny_leaves_other_commands_alone():
    assert _bash("ls -la; echo rm", _rule("deny", "bash", "rm *"), _rule("allow", "bash")) == "allow"


def test_policy_bash_ask_pattern_matches_like_deny():
    assert _bash("ls; git push", _rule("ask", "bash", "git push*"), _rule("allow", "bash")) == "ask"


# --- paths ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["src/a.py", "src/pkg/deep/b.py", "./src/a.py", f"{WORKSPACE}/src/a.py",
                                  "docs/../src/a.py", "src//a.py"])
def test_policy_path_allow_matches_normalised_paths(path):
    assert _decide("read_file", {"path": path}, _rule("allow", "read_file", "src/**")).effect == "allow"


@pytest.mark.parametrize("path", ["srcx/a.py", "a.py", "src/../.env", "../analyst/src/a.py", "/etc/passwd",
                                  f"{WORKSPACE}/../other/src/a.py", "src/../../x", ""])
def test_policy_path_allow_refuses_other_and_escaping_paths(path):
    assert _decide("write_file", {"path": path}, _rule("allow", "write_file", "src/**")).effect == "ask"


def test_policy_path_star_stays_in_one_directory_and_double_star_crosses():
    star, deep = _rule("allow", "read_file", "docs/*.md"), _rule("allow", "read_file", "**/*.md")
    assert _decide("read_file", {"path": "docs/a.md"}, star).effect == "allow"
    assert _decide("read_file", {"path": "docs/x/a.md"}, star).effect == "ask"
    assert _decide("read_file", {"path": "docs/x/a.md"}, deep).effect == "allow"
    assert _decide("read_file", {"path": "a.md"}, deep).effect == "allow"


def test_policy_path_deny_matches_dot_files_anywhere():
    rules = [_rule("deny", "read_file", "**/.env*", id=1), _rule("allow", "read_file", "**", id=2)]
    assert _decide("read_file", {"path": "app/.env.local"}, *rules).effect == "deny"
    assert _decide("read_file", {"path": f"{WORKSPACE}/.env"}, *rules).effect == "deny"
    assert _decide("read_file", {"path": "app/settings.py"}, *rules).effect == "allow"


def test_normalise_path_is_lexical_and_confined():
    assert normalise_path("a/./b/../c", WORKSPACE) == "a/c"
    assert normalise_path(WORKSPACE, WORKSPACE) == "."
    assert normalise_path(f"{WORKSPACE}x/a", WORKSPACE) is None  # a sibling directory sharing the prefix
    assert normalise_path("../x", WORKSPACE) is None
    assert normalise_path("/abs", None) is None


# --- hosts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, effect", [
    ("https://docs.python.org/3/", "allow"),
    ("HTTPS://DOCS.PYTHON.ORG/", "allow"),
    ("https://docs.python.org:443/x", "allow"),
    ("https://python.org/", "ask"),
    ("https://docs.python.org.evil.com/", "ask"),
    ("https://docs.python.org@evil.com/", "ask"),
    ("ftp://docs.python.org/", "ask"),
    ("https://docs.python.org\\@evil.com/", "ask"),
])
def test_policy_host_exact(url, effect):
    assert _decide("web_fetch", {"url": url}, _rule("allow", "web_fetch", "docs.python.org")).effect == effect


def test_policy_host_wildcard_matches_subdomains_not_the_domain():
    rule = _rule("allow", "web_fetch", "*.Example.com")
    assert _decide("web_fetch", {"url": "https://a.example.com/"}, rule).effect == "allow"
    assert _decide("web_fetch", {"url": "https://a.b.EXAMPLE.com/"}, rule).effect == "allow"
    assert _decide("web_fetch", {"url": "https://example.com/"}, rule).effect == "ask"
    assert _decide("web_fetch", {"url": "https://badexample.com/"}, rule).effect == "ask"


def test_policy_host_deny_wins_over_allow():
    rules = [_rule("allow", "web_fetch", id=1), _rule("deny", "web_fetch", "*.internal.example", id=2)]
    assert _decide("web_fetch", {"url": "http://db.internal.example/"}, *rules).effect == "deny"
    assert _decide("web_fetch", {"url": "http://public.example/"}, *rules).effect == "allow"


# --- engines that cannot ask ---------------------------------------------------------------------

def test_policy_allows_unconditionally_only_without_deny_or_ask_anywhere():
    allow = _rule("allow", "bash", id=1)
    assert policy_allows_unconditionally(tool_name="bash", rules=[allow], default_effect="ask")
    assert not policy_allows_unconditionally(tool_name="bash", rules=[], default_effect="ask")
    assert not policy_allows_unconditionally(tool_name="bash", rules=[allow, _rule("deny", "bash", "rm *", id=2)],
                                             default_effect="ask")
    assert not policy_allows_unconditionally(tool_name="bash", rules=[_rule("allow", "bash", "ls*")],
                                             default_effect="ask")
    assert not policy_allows_unconditionally(tool_name="read_file", rules=[_rule("deny", "read_file")],
                                             default_effect="allow")


# --- validation ----------------------------------------------------------------------------------

def _problems(**fields):
    base = dict(effect="allow", tool="bash", argument="", scope="global", agent_id=None, conversation_id=None)
    return rule_problems(**{**base, **fields})


def test_rule_problems_accepts_good_rules():
    assert _problems() == {}
    assert _problems(tool="mcp__filesystem__*", scope="agent", agent_id=1) == {}
    assert _problems(argument="git status*", scope="conversation", conversation_id="c") == {}
    assert _problems(tool="read_file", argument="src/**") == {}
    assert _problems(tool="web_fetch", argument="*.example.com") == {}


@pytest.mark.parametrize("fields, field", [
    ({"effect": "maybe"}, "effect"),
    ({"scope": "team"}, "scope"),
    ({"scope": "agent"}, "agent"),
    ({"scope": "conversation", "agent_id": 1}, "conversation_id"),
    ({"agent_id": 1}, "scope"),
    ({"tool": ""}, "tool"),
    ({"tool": "Bash"}, "tool"),
    ({"tool": "bash tool"}, "tool"),
    ({"tool": "x" * 101}, "tool"),
    ({"tool": "ba[sh"}, "tool"),
    ({"argument": "git status; rm x"}, "argument"),
    ({"argument": "ls\n"}, "argument"),
    ({"argument": "x" * 501}, "argument"),
    ({"argument": "   "}, "argument"),
    ({"tool": "run_python", "argument": "x"}, "argument"),
    ({"tool": "read_file", "argument": "/etc/*"}, "argument"),
    ({"tool": "read_file", "argument": "../x/**"}, "argument"),
    ({"tool": "web_fetch", "argument": "https://example.com/x"}, "argument"),
    ({"name": "n" * 201}, "name"),
])
def test_rule_problems_reports_the_field(fields, field):
    assert field in _problems(**fields)
