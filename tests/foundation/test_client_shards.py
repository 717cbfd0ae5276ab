"""Anthropic clients: the least busy shard, so one stream at a time reuses one connection pool."""
from __future__ import annotations

import pytest

from agents_app.engines.claude import lease_client


@pytest.fixture
def anthropic_settings(settings):
    settings.ANTHROPIC_API_KEY = "test-key"
    settings.ANTHROPIC_BASE_URL = "http://127.0.0.1:9"
    settings.ANTHROPIC_POOL_SHARDS = 4
    return settings


async def test_streams_one_after_another_use_the_same_client(anthropic_settings):
    clients = []
    for _ in range(5):
        client, release = lease_client()
        clients.append(client)
        release()
    assert all(c is clients[0] for c in clients)


async def test_concurrent_streams_spread_over_the_shards_and_come_back(anthropic_settings):
    leases = [lease_client() for _ in range(8)]
    clients = [client for client, _ in leases]
    assert len({id(c) for c in clients}) == 4
    assert all(clients.count(c) == 2 for c in clients)
    for _, release in leases[:4]:
        release()
        release()  # giving a lease back twice counts once
    again = [lease_client() for _ in range(4)]
    assert {id(c) for c, _ in again} == {id(c) for c in clients}  # each shard had one free place
    for _, release in leases[4:] + again:
        release()
    first, release = lease_client()
    assert first is clients[0]
    release()


async def test_each_provider_target_has_its_own_clients(anthropic_settings):
    class Target:
        api_key, bearer, base_url, max_retries = "other-key", True, "http://127.0.0.1:10", 0

    default, release_default = lease_client()
    other, release_other = lease_client(Target())
    assert default is not other and str(other.base_url).startswith("http://127.0.0.1:10")
    release_default()
    release_other()
