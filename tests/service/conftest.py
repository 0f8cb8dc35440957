from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis


@pytest.fixture
def rds(services) -> Iterator[redis.Redis]:
    """A client of the embedded Redis (tests/conftest.py's services)."""
    r = redis.Redis.from_url(services.redis_url, decode_responses=True)
    yield r
    r.close()
