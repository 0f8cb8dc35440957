# A key lookup that an outage left hanging is not joined by the requests that come after the
# database is back: KeyVerifier on the real Postgres, with the "outage" a server that accepts
# connections and never answers (what a SIGSTOPped Postgres does), so the first lookup hangs
# until libpq's connect timeout while the next request must be answered from the real database.
from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import sessionmaker

from api.auth import KeyVerifier
from metering.db import make_engine, make_sessionmaker
from service.errors import APIError

pytestmark = pytest.mark.timeout(60)

# The verifier's database timeout, and how long the silent server holds a connection attempt
# (libpq's connect timeout): the first lookup is still hanging when the second request has timed
# out, so a request that joined it would get 503.
TIMEOUT_S, SILENT_FOR_S = 3.0, 12


@pytest.fixture
def silent_database() -> Iterator[str]:
    """A URL whose server completes the TCP handshake (the kernel does) and never replies."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        yield f"postgresql://fleetlm@127.0.0.1:{port}/fleetlm"


class Switch:
    """Sessions from the silent server while `down`, else from the real database."""

    def __init__(self, down: sessionmaker, up: sessionmaker) -> None:
        self.down, self.up, self.is_down = down, up, True

    def __call__(self):
        return (self.down if self.is_down else self.up)()


def test_a_lookup_left_hanging_by_an_outage_is_not_joined_afterwards(
    services, sessions, tenant, silent_database
):
    # A pooled connection and the lookup's queries compiled once: the lookup after the outage
    # is quick even in a fresh environment on a busy machine.
    assert asyncio.run(KeyVerifier(sessions, cache_s=0).verify(f"Bearer {tenant.key}"))
    silent = make_engine(silent_database, connect_args={"connect_timeout": SILENT_FOR_S})
    switch = Switch(make_sessionmaker(silent), sessions)
    verifier = KeyVerifier(switch, cache_s=60, timeout_s=TIMEOUT_S)  # type: ignore[arg-type]

    async def scenario():
        with pytest.raises(APIError) as during:  # the database does not answer: 503 in time
            await verifier.verify(f"Bearer {tenant.key}")
        assert during.value.status == 503
        switch.is_down = False  # back; the first lookup still hangs on the silent server
        return await verifier.verify(f"Bearer {tenant.key}")

    try:
        principal = asyncio.run(scenario())
    finally:
        silent.dispose()
    assert principal.tenant_id == tenant.id
