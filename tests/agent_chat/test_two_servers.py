"""CHAT-050 / CHAT-030 across processes: two daphne servers, one database, one Redis channel layer.

The servers re-check confirmations and cancel flags only every 30 s, so a run that reacts
within seconds to a decision or cancel made on the *other* server was woken by the Redis
doorbell, with the database row as the truth.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Iterator

import requests

from tests.agent_chat.conftest import WRITE_TOOL, Frame, parse_block

# Far below the servers' 30 s re-check interval.
WAKE_LIMIT = 8.0


class HttpSse:
    """Reads seed-001 frames from a real HTTP response as they arrive."""

    def __init__(self, response: requests.Response):
        assert response.status_code == 200, response.text[:500]
        self.response = response
        self.frames: list[Frame] = []
        self._lines: Iterator[str] = response.iter_lines(decode_unicode=True, delimiter="\n")

    def next(self) -> Frame | None:
        block: list[str] = []
        for line in self._lines:
            if line == "":
                if block:
                    frame = parse_block("\n".join(block))
                    if frame is not None:
                        self.frames.append(frame)
                        return frame
                continue
            block.append(line)
        return None

    def until(self, predicate: Callable[[Frame], bool]) -> Frame:
        while (frame := self.next()) is not None:
            if frame.data and predicate(frame):
                return frame
        raise AssertionError(f"stream ended first: {[f.data for f in self.frames]}")

    def rest(self) -> list[Frame]:
        while self.next() is not None:
            pass
        return self.frames

    def logged(self) -> list[Frame]:
        return [f for f in self.frames if f.data is not None and f.event not in ("ping", "conversation.created")]


def _auth(pair) -> dict[str, str]:
    return {"Authorization": f"Token {pair.token}"}


def _chat(pair, url: str, body: dict[str, Any]) -> HttpSse:
    return HttpSse(requests.post(f"{url}/v1/agent/chat", json=body, headers=_auth(pair), stream=True, timeout=(5, 15)))


def _awaiting(frame: Frame) -> bool:
    return frame.event == "tool.state" and frame.payload["status"] == "awaiting_input"


def test_chat050_decision_on_another_server_process_wakes_the_waiting_run(server_pair):
    stream = _chat(server_pair, server_pair.a, {"input": f"{WRITE_TOOL}\nafter the tool", "agentRole": "coder"})
    awaiting = stream.until(_awaiting)
    confirmation_id = awaiting.payload["confirmationId"]

    pending = requests.get(f"{server_pair.b}/v1/tool-confirmations?status=pending", headers=_auth(server_pair), timeout=5)
    assert confirmation_id in [c["id"] for c in pending.json()]
    decided_at = time.monotonic()
    approve = requests.post(f"{server_pair.b}/v1/tool-confirmations/{confirmation_id}/approve",
                            headers=_auth(server_pair), timeout=5)
    assert approve.status_code == 200 and approve.json()["status"] == "approved"

    running = stream.until(lambda f: f.event == "tool.state" and f.payload["status"] == "running")
    assert time.monotonic() - decided_at < WAKE_LIMIT, "the run was not woken by the doorbell"
    assert running.payload["confirmationId"] == confirmation_id
    stream.rest()
    states = [f.payload["status"] for f in stream.frames if f.data and f.event == "tool.state"]
    assert states == ["pending", "awaiting_input", "running", "succeeded"]
    end = stream.logged()[-1]
    assert end.event == "agent.end" and end.payload["status"] == "succeeded"
    assert (server_pair.workspaces / "coder" / "notes.txt").read_text() == "hello from the tool"
    again = requests.post(f"{server_pair.b}/v1/tool-confirmations/{confirmation_id}/deny",
                          headers=_auth(server_pair), timeout=5)
    assert again.status_code == 409


def test_chat050_simultaneous_decisions_on_two_servers_first_wins(server_pair):
    stream = _chat(server_pair, server_pair.a, {"input": WRITE_TOOL, "agentRole": "coder"})
    confirmation_id = stream.until(_awaiting).payload["confirmationId"]
    barrier = threading.Barrier(4)
    results: list[tuple[str, int]] = []

    def decide(url: str, action: str) -> None:
        barrier.wait()
        response = requests.post(f"{url}/v1/tool-confirmations/{confirmation_id}/{action}", headers=_auth(server_pair),
                                 timeout=10)
        results.append((action, response.status_code))

    threads = [threading.Thread(target=decide, args=args) for args in
               [(server_pair.a, "approve"), (server_pair.b, "deny"), (server_pair.b, "approve"), (server_pair.a, "deny")]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert sorted(code for _, code in results) == [200, 409, 409, 409], results
    winner = next(action for action, code in results if code == 200)
    stream.rest()
    states = [f.payload["status"] for f in stream.frames if f.data and f.event == "tool.state"]
    assert states[-1] == ("succeeded" if winner == "approve" else "denied")


def test_chat030_reconnect_and_cancel_through_the_other_server(server_pair):
    stream = _chat(server_pair, server_pair.a, {"input": "/sleep 60", "agentRole": "coder"})
    start = stream.until(lambda f: f.event == "agent.start")
    run_id = stream.response.headers["X-Run-Id"]
    assert start.payload["runId"] == run_id

    # Reattach on server B (which reads the shared database), after event 1.
    replay = HttpSse(requests.get(f"{server_pair.b}/v1/agent/runs/{run_id}/events",
                                  headers={**_auth(server_pair), "Last-Event-ID": start.id}, stream=True,
                                  timeout=(5, 15)))
    replay.until(lambda f: f.event == "ping")  # B keeps the reattached stream alive too

    cancelled_at = time.monotonic()
    cancel = requests.post(f"{server_pair.b}/v1/agent/runs/{run_id}/cancel", headers=_auth(server_pair), timeout=15)
    assert cancel.status_code == 200 and cancel.json() == {"runId": run_id, "status": "cancelled"}
    assert time.monotonic() - cancelled_at < WAKE_LIMIT

    end_a = stream.until(lambda f: f.event == "agent.end")
    end_b = replay.until(lambda f: f.event == "agent.end")
    assert end_a.payload["status"] == end_b.payload["status"] == "cancelled"
    assert end_a.id == end_b.id
    ids = [int(f.id) for f in replay.logged()]
    assert ids == list(range(int(start.id) + 1, int(end_b.id) + 1))  # no gap, no duplicate

    timeline = requests.get(f"{server_pair.b}/v1/agent/runs/{run_id}/timeline", headers=_auth(server_pair), timeout=5)
    assert [e["event"] for e in timeline.json()["events"]][-1] == "agent.end"
    assert timeline.json()["status"] == "cancelled"
    again = requests.post(f"{server_pair.a}/v1/agent/runs/{run_id}/cancel", headers=_auth(server_pair), timeout=5)
    assert again.status_code == 409


def test_two_servers_share_postgres_when_available(server_pair):
    # Informational: which database backed the cross-process tests (PostgreSQL if reachable).
    assert server_pair.database in ("postgresql", "sqlite")
    health = requests.get(f"{server_pair.a}/health", timeout=5).json()
    assert health["status"] == "ok"
    print(json.dumps({"database": server_pair.database, "redis": server_pair.redis_url}))
