"""MCP servers are admin configuration: the run policy, the address check, the import of the old
per-agent JSON, and the admin pages. End to end over the endpoints: ``tests/seed003/test_mcp_policy.py``."""
from __future__ import annotations

import socket

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError

from orchestrator_site.errors import InvalidInput
from tools_app.mcp_client import mcp_url_refusal
from tools_app.mcp_import import export_agent_mcp_servers, import_agent_mcp_servers
from tools_app.mcp_policy import McpServerNotAllowed, mcp_servers_for_run
from tools_app.models import AgentMcpServer, McpServer
from tools_app.permissions import can_use_inline_mcp_servers

pytestmark = pytest.mark.django_db

ROLE = "coder"
INLINE = {"name": "mine", "command": ["python", "-m", "my_server"]}


def _server(name: str, *, agent=None, always: bool = False, **fields) -> McpServer:
    fields.setdefault("command", ["python", "-m", name])
    server = McpServer.objects.create(name=name, **fields)
    if agent is not None:
        AgentMcpServer.objects.create(agent=agent, server=server, always=always)
    return server


def _grant_inline(user):
    user.user_permissions.add(Permission.objects.get(codename="use_inline_mcp_servers", content_type__app_label="tools_app"))
    return type(user).objects.get(pk=user.pk)  # a fresh object: has_perm caches


@pytest.fixture
def public_dns(monkeypatch):
    """Host names ending in ``.test`` resolve to the addresses given here; others as usual."""
    table: dict[str, str] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, str) and host in table:
            return real(table[host], port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


# --- which servers a run gets --------------------------------------------------------------------

def test_mcp_servers_for_run_always_servers_then_requested_each_once(user, agents):
    agent = agents[ROLE]
    _server("zeta", agent=agent, always=True)
    _server("alpha", agent=agent, always=True)
    _server("docs", agent=agent, always=False)
    _server("off", agent=agent, always=True, enabled=False)  # a disabled server is never attached
    specs = mcp_servers_for_run(user=user, agent=agent, requested=["docs", {"name": "alpha"}, "docs"])
    assert [s["name"] for s in specs] == ["alpha", "zeta", "docs"]
    assert specs[0] == {"name": "alpha", "command": ["python", "-m", "alpha"], "env": {}, "requires_approval": True}
    assert [s["name"] for s in mcp_servers_for_run(user=user, agent=agent, requested=None)] == ["alpha", "zeta"]
    assert mcp_servers_for_run(user=user, agent=agents["researcher"], requested=[]) == []


@pytest.mark.parametrize("case", ["unknown", "disabled", "other_agent", "unlinked"])
def test_mcp_servers_for_run_refuses_names_the_agent_may_not_use(user, agents, case):
    agent = agents[ROLE]
    if case == "disabled":
        _server("calc", agent=agent, enabled=False, env={"SECRET": "s3cret"})
    elif case == "other_agent":
        _server("calc", agent=agents["researcher"], always=True, env={"SECRET": "s3cret"})
    elif case == "unlinked":
        _server("calc", env={"SECRET": "s3cret"})
    with pytest.raises(McpServerNotAllowed) as info:
        mcp_servers_for_run(user=user, agent=agent, requested=["calc"])
    assert (info.value.status, info.value.code) == (403, "mcp_server_not_allowed")
    assert "'calc'" in info.value.message
    # The same answer whatever the reason, and nothing of the server's configuration.
    assert "python" not in info.value.message and "s3cret" not in info.value.message
    assert "disabled" not in info.value.message and "another" not in info.value.message


@pytest.mark.parametrize("spec", [
    INLINE,
    {"name": "x", "command": "sh", "args": ["-c", "id > /tmp/x"]},
    {"name": "x", "url": "https://example.com/mcp"},
    {"name": "x", "env": {"A": "b"}},
    {"name": "x", "requires_approval": False},
    {"command": ["sh"]},
])
def test_mcp_servers_for_run_refuses_inline_specs_without_the_permission(user, agents, spec):
    with pytest.raises(McpServerNotAllowed) as info:
        mcp_servers_for_run(user=user, agent=agents[ROLE], requested=[spec])
    assert info.value.code == "mcp_server_not_allowed" and "use_inline_mcp_servers" in info.value.message
    with pytest.raises(McpServerNotAllowed):
        mcp_servers_for_run(user=user, agent=agents[ROLE], requested=[spec], allow_inline=False)


@pytest.mark.parametrize("requested", [
    "calc", {"name": "calc"}, [5], [None], [["calc"]], [{"name": 5}], [{"name": "a b"}], [""], [{}], ["x" * 65],
])
def test_mcp_servers_for_run_bad_shapes_are_invalid_input(user, agents, requested):
    with pytest.raises(InvalidInput) as info:
        mcp_servers_for_run(user=user, agent=agents[ROLE], requested=requested)
    assert (info.value.status, info.value.code) == (400, "invalid_input")


def test_mcp_servers_for_run_inline_with_permission_superuser_or_allow_inline(user, agents, django_user_model):
    agent = agents[ROLE]
    _server("calc", agent=agent, always=True)
    expected = ["calc", "mine"]
    assert not can_use_inline_mcp_servers(user=user)
    granted = _grant_inline(user)
    assert can_use_inline_mcp_servers(user=granted)
    assert [s["name"] for s in mcp_servers_for_run(user=granted, agent=agent, requested=[INLINE])] == expected
    # Superusers hold every permission (Django's has_perm), this one included.
    root = django_user_model.objects.create_superuser("root", password="pw")
    assert [s["name"] for s in mcp_servers_for_run(user=root, agent=agent, requested=[INLINE])] == expected
    # A transport whose client owns the process (local stdio ACP) may allow it outright ...
    assert [s["name"] for s in mcp_servers_for_run(user=user, agent=agent, requested=[INLINE], allow_inline=True)] == expected
    # ... and a caller may refuse it even to a permission holder.
    with pytest.raises(McpServerNotAllowed):
        mcp_servers_for_run(user=root, agent=agent, requested=[INLINE], allow_inline=False)
    inactive = django_user_model.objects.create_superuser("gone", password="pw", is_active=False)
    assert not can_use_inline_mcp_servers(user=inactive)


def test_mcp_servers_for_run_inline_specs_are_validated_and_never_trusted(user, agents, public_dns):
    agent, granted = agents[ROLE], _grant_inline(user)
    _server("calc", agent=agent, always=True)
    with pytest.raises(InvalidInput, match="exactly one of"):
        mcp_servers_for_run(user=granted, agent=agent, requested=[{"name": "x", "env": {}}])
    with pytest.raises(InvalidInput, match="used twice"):
        mcp_servers_for_run(user=granted, agent=agent, requested=[{**INLINE, "name": "calc"}])
    with pytest.raises(McpServerNotAllowed, match="only an admin's registered server can be trusted"):
        mcp_servers_for_run(user=granted, agent=agent, requested=[{"name": "x", "url": "http://10.0.0.5/mcp", "trusted": True}])
    public_dns["docs.test"] = "93.184.216.34"
    (_, spec) = mcp_servers_for_run(user=granted, agent=agent, requested=[{"name": "x", "url": "http://docs.test/mcp"}])
    assert spec == {"name": "x", "url": "http://docs.test/mcp", "headers": {}, "trusted": False, "requires_approval": True}


# --- addresses -----------------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/mcp", "http://localhost/mcp", "http://[::1]/mcp", "http://10.1.2.3/mcp",
    "http://192.168.0.1/mcp", "http://169.254.169.254/latest", "http://[::ffff:127.0.0.1]/mcp", "http://0.0.0.0/mcp",
    "http://inside.test/mcp",
])
def test_mcp_servers_for_run_refuses_inline_urls_to_internal_addresses(user, agents, public_dns, url):
    public_dns["inside.test"] = "10.9.8.7"
    granted = _grant_inline(user)
    with pytest.raises(McpServerNotAllowed) as info:
        mcp_servers_for_run(user=granted, agent=agents[ROLE], requested=[{"name": "x", "url": url}])
    assert info.value.status == 403 and "address not allowed" in info.value.message


def test_mcp_url_refusal_follows_web_fetch_allow_private(tool_settings):
    assert "loopback" in mcp_url_refusal("http://127.0.0.1:9/mcp")
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = True
    assert mcp_url_refusal("http://127.0.0.1:9/mcp") is None
    assert "metadata" in mcp_url_refusal("http://169.254.169.254/")  # refused even then
    tool_settings["WEB_FETCH_ALLOW_PRIVATE"] = False
    # A host that does not resolve now is left to the check when connecting (mcp_connect_failed).
    assert mcp_url_refusal("http://no-such-host.invalid/mcp") is None


def test_mcp_servers_for_run_checks_registered_urls_unless_trusted(user, agents):
    agent = agents[ROLE]
    _server("lan", agent=agent, always=True, transport="http", command=[], url="http://10.0.0.7:9000/mcp")
    with pytest.raises(McpServerNotAllowed) as info:
        mcp_servers_for_run(user=user, agent=agent, requested=None)
    # An admin's address is configuration the caller does not get to see.
    assert "'lan'" in info.value.message and "trusted" in info.value.message and "10.0.0.7" not in info.value.message
    McpServer.objects.filter(name="lan").update(trusted=True)
    (spec,) = mcp_servers_for_run(user=user, agent=agent, requested=None)
    assert spec["trusted"] is True and spec["url"] == "http://10.0.0.7:9000/mcp"


# --- the model -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, problem", [
    ({"name": "a b"}, "name"),
    ({"command": []}, "must not be empty"),
    ({"env": {"K": 1}}, "'env'"),
    ({"url": "http://h/mcp"}, "exactly one of"),
    ({"headers": {"A": "b"}}, "'headers' is for HTTP"),
    ({"trusted": True}, "'trusted' is for HTTP"),
    ({"requires_approval": "yes"}, "requires_approval"),
    ({"timeout": 0}, "timeout"),
    ({"transport": "http", "url": "http://h/mcp"}, "exactly one of"),  # the stdio command is still there
    ({"transport": "http", "command": [], "url": "ftp://h"}, "'url'"),
    ({"transport": "http", "command": [], "url": "http://h/mcp", "env": {"A": "b"}}, "'env' is for stdio"),
    ({"transport": "http", "command": [], "url": "http://127.0.0.1:9000/mcp"}, "loopback"),
])
def test_mcp_server_clean_uses_the_config_rules(fields, problem):
    server = McpServer(**{"name": "calc", "command": ["python", "-m", "calc"], **fields})
    with pytest.raises(ValidationError, match=problem):
        server.full_clean()


def test_mcp_server_clean_accepts_valid_rows_and_to_spec_is_the_toolset_shape():
    stdio = McpServer(name="calc", command=["python", "-m", "calc"], env={"K": "v"}, cwd="/srv", timeout=5,
                      requires_approval=["add"])
    stdio.full_clean()
    assert stdio.to_spec() == {"name": "calc", "type": "stdio", "command": ["python", "-m", "calc"], "env": {"K": "v"},
                               "cwd": "/srv", "timeout": 5, "requires_approval": ["add"]}
    http = McpServer(name="docs", transport="http", url="http://127.0.0.1:9000/mcp", trusted=True,
                     headers={"Authorization": "Bearer x"}, requires_approval=False)
    http.full_clean()
    assert http.to_spec() == {"name": "docs", "type": "http", "url": "http://127.0.0.1:9000/mcp",
                              "headers": {"Authorization": "Bearer x"}, "trusted": True, "requires_approval": False}


# --- the old per-agent JSON ----------------------------------------------------------------------

def test_import_agent_mcp_servers_turns_agent_json_into_rows_idempotently(agents):
    coder, researcher, analyst = agents["coder"], agents["researcher"], agents["dev_efficiency_analyst"]
    calc = {"name": "calc", "command": ["python", "-m", "calc"], "env": {"K": "v"}}
    legacy = [
        (coder.pk, "coder", [calc, {"name": "docs", "url": "http://10.0.0.7/mcp", "headers": {"A": "b"},
                                    "requires_approval": ["write"], "timeout": 5}]),
        (researcher.pk, "researcher", [{"name": "calc", "command": "python", "args": ["-m", "calc"], "env": {"K": "v"}}]),
        (analyst.pk, "dev_efficiency_analyst", [{**calc, "command": ["python", "-m", "other_calc"]},
                                                {"name": "broken", "command": []}]),
        (agents["orchestrator"].pk, "orchestrator", []),
    ]
    created = import_agent_mcp_servers(agents=legacy, server_model=McpServer, link_model=AgentMcpServer)
    assert created == ["calc", "docs", "calc-2"]  # the same calc is shared; a different one gets a suffix
    links = {(link.agent.role, link.server.name, link.always) for link in AgentMcpServer.objects.select_related("agent", "server")}
    assert links == {("coder", "calc", True), ("coder", "docs", True), ("researcher", "calc", True),
                     ("dev_efficiency_analyst", "calc-2", True)}
    docs = McpServer.objects.get(name="docs")
    assert (docs.transport, docs.url, docs.headers, docs.requires_approval, docs.timeout) == (
        "http", "http://10.0.0.7/mcp", {"A": "b"}, ["write"], 5)
    assert docs.trusted and docs.enabled  # admins wrote it and it connected before: it keeps working
    assert "was named 'calc'" in McpServer.objects.get(name="calc-2").description
    assert not McpServer.objects.filter(name="broken").exists()  # invalid entries are skipped (logged)
    # The runs of each agent get what the JSON gave them.
    assert [s["name"] for s in mcp_servers_for_run(user=None, agent=coder, requested=None)] == ["calc", "docs"]

    assert import_agent_mcp_servers(agents=legacy, server_model=McpServer, link_model=AgentMcpServer) == []
    assert McpServer.objects.count() == 3 and AgentMcpServer.objects.count() == 4
    # And back (the reverse migration): each agent's JSON from its always servers.
    exported = export_agent_mcp_servers(link_model=AgentMcpServer)
    assert exported[researcher.pk] == [{"name": "calc", "command": ["python", "-m", "calc"], "env": {"K": "v"},
                                        "requires_approval": True}]
    assert [e["name"] for e in exported[coder.pk]] == ["calc", "docs"]


def test_import_agent_mcp_servers_suffixes_stay_within_the_name_limit(agents):
    long = "s" * 64
    legacy = [(agents["coder"].pk, "coder", [{"name": long, "command": ["a"]}]),
              (agents["researcher"].pk, "researcher", [{"name": long, "command": ["b"]}])]
    assert import_agent_mcp_servers(agents=legacy, server_model=McpServer, link_model=AgentMcpServer) == [
        long, "s" * 62 + "-2"]


def test_default_agents_load_without_mcp_servers(agents):
    from agents_app.defaults import load_default_agents

    assert load_default_agents() == []  # already there: nothing created, nothing fails
    assert not AgentMcpServer.objects.exists()


# --- admin ---------------------------------------------------------------------------------------

def test_mcp_server_admin_pages_render_and_add_a_server_with_its_agents(admin_client, agents):
    assert admin_client.get("/admin/tools_app/mcpserver/").status_code == 200
    page = admin_client.get("/admin/tools_app/mcpserver/add/")
    assert page.status_code == 200 and b'name="agent_links-TOTAL_FORMS"' in page.content
    form = {
        "name": "calc", "transport": "stdio", "command": '["python", "-m", "calc"]', "env": "{}", "cwd": "",
        "url": "", "headers": "{}", "timeout": "", "requires_approval": "true", "enabled": "on", "description": "",
        "agent_links-TOTAL_FORMS": "1", "agent_links-INITIAL_FORMS": "0", "agent_links-MIN_NUM_FORMS": "0",
        "agent_links-MAX_NUM_FORMS": "1000", "agent_links-0-agent": str(agents["coder"].pk), "agent_links-0-always": "on",
    }
    response = admin_client.post("/admin/tools_app/mcpserver/add/", form)
    assert response.status_code == 302, response.content.decode()[-3000:]
    link = AgentMcpServer.objects.select_related("server").get()
    assert (link.agent_id, link.server.name, link.always, link.server.requires_approval) == (agents["coder"].pk, "calc", True, True)
    listing = admin_client.get("/admin/tools_app/mcpserver/")
    assert b"calc" in listing.content

    bad = admin_client.post("/admin/tools_app/mcpserver/add/", {
        **form, "name": "lan", "transport": "http", "command": "[]", "url": "http://127.0.0.1:9000/mcp"})
    assert bad.status_code == 200 and b"Tick" in bad.content and not McpServer.objects.filter(name="lan").exists()


def test_agent_admin_shows_mcp_servers_inline_instead_of_json(admin_client, agents):
    _server("calc", agent=agents["coder"], always=True)
    page = admin_client.get(f"/admin/agents_app/agent/{agents['coder'].pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="mcp_server_links-TOTAL_FORMS"' in html and "MCP servers" in html
    assert 'name="mcp_servers"' not in html  # the old JSON field is gone
