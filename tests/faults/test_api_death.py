# The API process relaying a stream dies (SIGKILL) mid-stream: its clients' connections drop,
# and each request's worker learns the process is gone from the request's lapsed lease and
# stops it, billed at most what its client was sent (the rule of a client that hangs up) —
# not the whole max_tokens it would otherwise have generated on for nobody.
from __future__ import annotations

import os
import signal

import pytest

from service import streams as p
from tests.e2e.test_api_processes import api_pids
from tests.faults.conftest import (
    completion_body,
    fault_server,
    join_all,
    received_tokens,
    start_streams,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

NUM_STREAMS = 4
MAX_TOKENS = 4000  # minutes of streaming on CPU: still running long after the kill
LEASE_ENV = {"FLEETLM_API_LEASE_REFRESH_S": "0.2", "FLEETLM_API_LEASE_TTL_S": "1.0"}
# A line the client had on the wire but not yet parsed when the connection dropped.
SLACK = 2


def test_streams_of_a_killed_api_process_are_stopped_and_billed_what_was_sent(tmp_path_factory):
    server = fault_server(
        tmp_path_factory, "api-death", workers=None, FLEETLM_API_PROCESSES="1", **LEASE_ENV
    )
    try:
        pids = wait_until(lambda: api_pids(server.proc.pid), 30, "the API process")
        threads, logs = start_streams(server, [completion_body(MAX_TOKENS)] * NUM_STREAMS)
        wait_until(lambda: all(lg.num_chunks >= 20 for lg in logs), 90, "every stream to run")
        # and every lease rewritten since (every 0.2 s) with what its stream was sent: on an idle
        # machine 20 tokens can stream inside one refresh, and the kill must find them recorded
        rds = server.redis
        wait_until(
            lambda: all(
                (p.delivered_of(rds.get(p.lease_key(lg.request_id))) or 0) > 0 for lg in logs
            ),
            30,
            "every lease to record delivered tokens",
        )
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        join_all(threads)
        for lg in logs:
            assert lg.status == 200 and lg.exception is not None, lg  # the connection dropped

        rows = {r.request_id: r for r in server.usage_rows([lg.request_id for lg in logs], 90)}
        billed = []
        for lg in logs:
            row = rows[lg.request_id]
            assert row.status == "cancelled", (row.status, row.completion_tokens)
            lo, hi = received_tokens(server, lg)
            assert row.completion_tokens <= hi + SLACK, (row.completion_tokens, (lo, hi))
            billed.append((row.completion_tokens, hi))
        assert any(n > 0 for n, _ in billed), billed  # the leases carried what was sent

        def idle():
            stats = server.workers_stats()
            return stats and all(
                w["num_running"] == 0 and w["num_free_blocks"] == w["num_total_blocks"]
                for w in stats
            )

        wait_until(idle, 60, "every KV block to be free again", 0.2)
        print(f"API process killed: (billed, received) per stream {billed}")
    finally:
        rc = server.stop()
    assert rc == 0, server.log()
