"""The stream lane answers exactly as Django's full request path does, and only takes what it may.

Each request goes once through the served app (the lane in front of Django's handler) and once
through Django's handler alone; status, headers (the run's ids aside) and body must be equal,
and the lane must have served exactly the requests it is meant for (see
``orchestrator_site/stream_lane.py``).
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from orchestrator_site import stream_lane
from orchestrator_site.asgi_handler import OrchestratorASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)

IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


async def _call(app, method: str, path: str, *, body: bytes = b"", headers: dict[str, str] | None = None,
                host: str = "testserver") -> tuple[int, list[tuple[str, str]], bytes]:
    path, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", host.encode())] + [(k.lower().encode(), v.encode()) for k, v in
                                                 {**(headers or {}), "Content-Length": str(len(body))}.items()],
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }
    inbox: asyncio.Queue = asyncio.Queue()
    await inbox.put({"type": "http.request", "body": body, "more_body": False})
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, inbox.get, send), 30)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert not sent[-1].get("more_body"), "the response did not end"
    return start["status"], [(k.decode().lower(), v.decode()) for k, v in start["headers"]], content


def _normalized(response: tuple[int, list[tuple[str, str]], bytes]) -> tuple[int, list[tuple[str, str]], Any]:
    status, headers, content = response
    kept = sorted((k, IDS.sub("<id>", v)) for k, v in headers)
    if headers and dict(headers).get("content-type", "").startswith("text/event-stream"):
        # Ids and times differ between two runs; the sequence of events must not.
        frames = [json.loads(line[6:]) for line in content.decode().split("\n")
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return status, kept, [(f.get("event") or f.get("type"), (f.get("data") or {}).get("status")
                               if isinstance(f.get("data"), dict) else None) for f in frames]
    return status, kept, content


@pytest.fixture
def apps(monkeypatch):
    served: list[str] = []
    serve = stream_lane._serve

    async def counting(handler, request, route, scope, receive, send):
        served.append(scope["path"])
        await serve(handler, request, route, scope, receive, send)

    monkeypatch.setattr(stream_lane, "_serve", counting)
    django = OrchestratorASGIHandler()
    return stream_lane.StreamLane(django), django, served


async def _both(apps, method: str, path: str, **kwargs: Any):
    lane, django, served = apps
    before = len(served)
    via_lane = await _call(lane, method, path, **kwargs)
    took_lane = len(served) > before
    via_django = await _call(django, method, path, **kwargs)
    assert _normalized(via_lane) == _normalized(via_django)
    return via_lane, took_lane


def _json_headers(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Token {token}", "Content-Type": "application/json", **extra}


CHAT = json.dumps({"input": "hello", "agentRole": "coder"}).encode()


@pytest.mark.parametrize("case, method, path, body, extra, status", [
    ("a chat stream", "POST", "/v1/agent/chat", CHAT, {"Accept": "text/event-stream"}, 200),
    ("the AI SDK dialect", "POST", "/v1/agent/chat?format=vercel-ai", CHAT, {}, 200),
    ("an unknown dialect", "POST", "/v1/agent/chat?format=nope", CHAT, {}, 400),
    ("a body that is not JSON", "POST", "/v1/agent/chat", b"{not json", {}, 400),
    ("a body that is not an object", "POST", "/v1/agent/chat", b"[1, 2]", {}, 400),
    ("no input", "POST", "/v1/agent/chat", b"{}", {}, 400),
    ("an unacceptable Accept", "POST", "/v1/agent/chat", CHAT, {"Accept": "text/html"}, 406),
    ("a method the view has not", "GET", "/v1/agent/chat", b"", {}, 405),
    ("cancel of an unknown run", "POST", "/v1/agent/runs/00000000-0000-0000-0000-000000000000/cancel", b"", {}, 404),
    ("events of an unknown run", "GET", "/v1/agent/runs/nope/events", b"", {}, 404),
    ("the seed-000 stream", "POST", "/api/v1/chat/stream", json.dumps({"message": "hi", "agent_role": "coder"}).encode(),
     {}, 200),
])
async def test_the_lane_answers_as_django_does(apps, token, agents, case, method, path, body, extra, status):
    (got_status, _, content), took_lane = await _both(apps, method, path, body=body, headers=_json_headers(token, **extra))
    assert got_status == status, content[:300]
    assert took_lane, f"{case}: the lane should have served it"


@pytest.mark.parametrize("case, header", [
    ("an unknown token", "Token not-a-token"),
    ("a bearer header without a key", "Bearer"),
    ("a token header with extra words", "Token a b"),
])
async def test_bad_credentials_get_the_same_401(apps, agents, case, header):
    (status, headers, content), _ = await _both(apps, "POST", "/v1/agent/chat", body=CHAT,
                                                headers={"Authorization": header, "Content-Type": "application/json"})
    assert status == 401 and dict(headers)["www-authenticate"] == "Token"
    assert json.loads(content)["code"] == "not_authenticated" or json.loads(content)["code"] == "authentication_failed"


@pytest.mark.parametrize("case, headers, host, body", [
    ("a session cookie (CSRF and the session are Django's)", {"Cookie": "sessionid=x"}, "testserver", CHAT),
    ("an Origin (CORS is Django's)", {"Origin": "http://elsewhere.example"}, "testserver", CHAT),
    ("a host not allowed", {}, "evil.example", CHAT),
    ("a body over the size limit", {}, "testserver", b"{" + b" " * 1_100_000 + b"}"),
    ("no Authorization", {"Authorization": ""}, "testserver", CHAT),
])
async def test_what_the_lane_leaves_to_django_gets_djangos_answer(apps, token, agents, case, headers, host, body):
    (status, got_headers, content), took_lane = await _both(
        apps, "POST", "/v1/agent/chat", body=body, host=host, headers={**_json_headers(token), **headers})
    assert not took_lane, f"{case}: the lane must leave it to Django"
    if "Origin" in headers:
        assert status == 200 and dict(got_headers)["access-control-allow-origin"] == "http://elsewhere.example"
    elif host != "testserver":
        assert status == 400
    elif len(body) > 1_000_000:
        assert status == 413 and json.loads(content)["code"] == "request_too_large"


async def test_another_users_run_is_not_found_through_the_lane(apps, token, other_user, agents):
    from rest_framework.authtoken.models import Token

    lane, _, served = apps
    status, headers, _ = await _call(lane, "POST", "/v1/agent/chat", body=CHAT, headers=_json_headers(token))
    run_id = dict(headers)["x-run-id"]
    other = (await asyncio.to_thread(lambda: Token.objects.get_or_create(user=other_user)[0])).key
    for method, path in [("GET", f"/v1/agent/runs/{run_id}/events"), ("POST", f"/v1/agent/runs/{run_id}/cancel")]:
        status, _, content = await _call(lane, method, path, headers=_json_headers(other))
        assert status == 404 and json.loads(content)["code"] == "run_not_found"
    assert len(served) == 3


async def test_lane_responses_carry_the_middleware_headers(apps, token, agents):
    lane, _, _ = apps
    _, headers, _ = await _call(lane, "POST", "/v1/agent/chat", body=CHAT, headers=_json_headers(token))
    got = dict(headers)
    assert got["x-frame-options"] == "DENY" and got["x-content-type-options"] == "nosniff"
    assert got["referrer-policy"] == "same-origin" and got["cross-origin-opener-policy"] == "same-origin"
    assert got["vary"] == "origin" and got["content-type"].startswith("text/event-stream")


async def test_lane_site_headers_follow_a_settings_change(apps, token, agents, settings):
    # The lane computes the middleware's fixed headers once; a changed setting must show at once.
    lane, _, _ = apps
    await _call(lane, "POST", "/v1/agent/chat", body=CHAT, headers=_json_headers(token))
    settings.X_FRAME_OPTIONS = "SAMEORIGIN"
    settings.SECURE_REFERRER_POLICY = "no-referrer"
    served = apps[2]
    before = len(served)
    # (Django's SecurityMiddleware reads its settings once, when the handler is built, so only
    # the lane's answer is looked at here.)
    status, headers, _ = await _call(lane, "POST", "/v1/agent/chat", body=CHAT, headers=_json_headers(token))
    got = dict(headers)
    assert len(served) > before and status == 200
    assert got["x-frame-options"] == "SAMEORIGIN" and got["referrer-policy"] == "no-referrer"


async def test_stream_lane_setting_off_sends_everything_to_django(apps, token, agents, settings):
    settings.STREAM_LANE = False
    _, took_lane = await _both(apps, "POST", "/v1/agent/chat", body=CHAT, headers=_json_headers(token))
    assert not took_lane


@pytest.mark.parametrize("path", ["/v1/agent/chat", "/v1/agent/runs/nope/events", "/api/v1/chat/stream", "/chat"])
async def test_options_describes_the_view_and_other_methods_get_405(apps, token, agents, path):
    (status, headers, content), took_lane = await _both(apps, "OPTIONS", path, headers=_json_headers(token))
    assert status == 200 and took_lane
    assert "OPTIONS" in dict(headers)["allow"] and json.loads(content)["name"]
    (status, headers, content), _ = await _both(apps, "PUT", path, headers=_json_headers(token))
    assert status == 405 and json.loads(content)["code"] == "method_not_allowed"
    assert "OPTIONS" in dict(headers)["allow"]


async def test_options_without_credentials_is_401(apps, agents):
    (status, _, content), _ = await _both(apps, "OPTIONS", "/v1/agent/chat", headers={"Authorization": "Token nope"})
    assert status == 401 and json.loads(content)["code"] in ("authentication_failed", "not_authenticated")


async def test_the_lanes_host_check_is_djangos_remembered_and_follows_a_settings_change(apps, token, agents, settings):
    lane, _, served = apps
    stream_lane._HOSTS.clear()
    for _ in range(2):  # refused, then refused again from what was remembered
        status, _, _ = await _call(lane, "POST", "/v1/agent/chat", body=CHAT, headers=_json_headers(token),
                                   host="late.example")
        assert status == 400 and served == []
    assert stream_lane._HOSTS == {"late.example": False}
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "late.example"]  # forgets what it remembered
    status, _, _ = await _call(lane, "POST", "/v1/agent/chat", body=CHAT, headers=_json_headers(token),
                               host="late.example")
    assert status == 200 and served == ["/v1/agent/chat"]
    stream_lane._HOSTS.clear()
    for n in range(stream_lane.MAX_HOSTS + 3):  # a client varying its Host header fills nothing past the bound
        request = type("R", (), {"_get_raw_host": lambda self, n=n: f"h{n}.example",
                                 "get_host": lambda self: (_ for _ in ()).throw(stream_lane.DisallowedHost())})()
        assert stream_lane._host_allowed(request) is False
    assert len(stream_lane._HOSTS) <= stream_lane.MAX_HOSTS
