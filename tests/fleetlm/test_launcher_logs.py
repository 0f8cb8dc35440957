# `fleetlm bench serve --launch` reads the launched server's log: the API's event-loop stalls
# (api/loop_watch.py) logged during a run come back with the worst one and where it was held.
# The lines are written by a real LoopWatch through the serve console's own text formatter.
from __future__ import annotations

import asyncio
import logging
import time

from api.loop_watch import LoopWatch
from fleetlm.bench.launcher import LaunchedServer
from service.logging_setup import TextFormatter


def held_for_a_while() -> None:
    time.sleep(0.6)


def test_loop_stalls_in_the_log_since_a_time(tmp_path):
    server = LaunchedServer(None, data_dir=tmp_path)
    handler = logging.FileHandler(server.log_path)
    handler.setFormatter(TextFormatter("api"))
    logger = logging.getLogger("fleetlm.api")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.WARNING)
    since = time.time()

    async def main() -> None:
        watch = LoopWatch(stall_s=0.2)
        watch.start()
        try:
            await asyncio.sleep(0.2)
            held_for_a_while()
            deadline = time.monotonic() + 30
            while server.loop_stalls(since)["logged"] == 0:
                assert time.monotonic() < deadline, server.log_tail()
                await asyncio.sleep(0.05)
        finally:
            await watch.aclose()

    try:
        asyncio.run(main())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.close()
    stalls = server.loop_stalls(since)
    assert stalls["logged"] >= 1 and stalls["worst_ms"] >= 300
    assert stalls["worst_where"].startswith("test_launcher_logs.py:")
    assert "held_for_a_while" in stalls["worst_where"]
    assert 0 <= stalls["worst_gc_ms"] <= stalls["worst_ms"]
    # A run that started after the stall does not count it.
    assert server.loop_stalls(time.time() + 5)["logged"] == 0
