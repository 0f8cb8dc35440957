# SIGTERM to `fleetlm serve` during long streams: admission stops, in-flight work goes on until
# drain_timeout_s, then each remaining stream ends with an explicit `shutdown` error event and
# [DONE] (the engine's request cancelled), billed for exactly what its client received; serve
# exits within drain_timeout_s plus a few seconds.
from __future__ import annotations

import signal
import time

import pytest

from service.embedded import EmbeddedServices
from tests.faults.conftest import (
    LIVENESS_BOUND_S,
    SLACK_S,
    check_billing,
    completion_body,
    fault_server,
    join_all,
    start_streams,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

DRAIN_TIMEOUT_S = 4.0
EXIT_SLACK_S = 8.0  # the writer's last flush, Celery, the embedded services' stop, a loaded CPU


def test_sigterm_during_long_streams_ends_them_explicitly_and_exits_in_time(tmp_path_factory):
    srv = fault_server(
        tmp_path_factory,
        "drain",
        workers=1,
        FLEETLM_DRAIN_TIMEOUT_S=str(DRAIN_TIMEOUT_S),
        FLEETLM_NUM_KV_BLOCKS="1200",  # room for every stream whole: no preemption
    )
    try:
        # Long enough to be running at the deadline however fast the machine is today.
        # Usage at the end (two), on every chunk (two), or none: an error end carries it too.
        options = [{"include_usage": True}] * 2 + [{"continuous_usage_stats": True}] * 2
        bodies = [completion_body(2500) for _ in range(2)]
        bodies += [completion_body(2500, stream_options=o) for o in options]
        threads, logs = start_streams(srv, bodies)
        wait_until(lambda: all(lg.num_chunks >= 3 for lg in logs), 60, "every stream to start")
        signalled = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(timeout=DRAIN_TIMEOUT_S + 60)
        exited_after_s = time.monotonic() - signalled
        join_all(threads, timeout_s=30)
    finally:
        if srv.proc.poll() is None:
            srv.stop()
    assert rc == 0, srv.log()
    assert exited_after_s <= DRAIN_TIMEOUT_S + EXIT_SLACK_S, exited_after_s
    for lg in logs:
        assert lg.status == 200 and lg.exception is None, lg
        assert lg.ended_properly and lg.finish_reason is None, lg
        assert lg.error["code"] == "shutdown", lg.error
        assert lg.max_gap_s() <= LIVENESS_BOUND_S + SLACK_S
        ended_after_s = lg.times[-1] - signalled
        assert DRAIN_TIMEOUT_S - 1 <= ended_after_s <= DRAIN_TIMEOUT_S + SLACK_S, ended_after_s
    # The services again (stopped with serve), to read what was published and billed.
    services = EmbeddedServices(srv.data_dir)
    services.start(redis=True, postgres=True)
    try:
        rows = check_billing(srv, logs, timeout_s=10)
    finally:
        services.stop()
    assert {row.status for row in rows.values()} == {"failed"}
    for lg in logs[2:]:  # billed = the last usage the client was sent
        assert lg.usage is not None, lg
        assert lg.usage["completion_tokens"] == rows[lg.request_id].completion_tokens, lg.usage
    ended = [lg.times[-1] - signalled for lg in logs]
    print(
        f"drain: streams ended {min(ended):.1f}-{max(ended):.1f}s and serve exited "
        f"{exited_after_s:.1f}s after SIGTERM (drain_timeout_s {DRAIN_TIMEOUT_S:.0f})"
    )
