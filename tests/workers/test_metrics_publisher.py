# The worker's metrics snapshot leaves the step thread (workers/gpu/metrics_publisher.py): a
# submitted snapshot reaches Redis with the worker's TTL and the registry's current values, a
# failed write is survived and the next one lands, and nothing is written once it is closed
# (the worker deletes the key right after, which a late write would undo). Real embedded Redis.
import redis

from service import streams as p
from tests.waiting import wait_until
from workers.gpu.metrics import WorkerMetrics
from workers.gpu.metrics_publisher import MetricsPublisher

KEY = p.metrics_key("w-publisher-test")


class _Stats:
    num_running, num_waiting, kv_cache_usage = 3, 1, 0.25


def _publisher(url: str) -> tuple[WorkerMetrics, MetricsPublisher, redis.Redis]:
    metrics = WorkerMetrics("m", snapshot_interval_s=0.0)
    client = redis.Redis.from_url(url)
    return metrics, MetricsPublisher(client, metrics.registry, KEY, ttl_ms=60_000), client


def test_a_submitted_snapshot_lands_with_ttl_and_current_values(services):
    metrics, publisher, client = _publisher(services.redis_url)
    client.delete(KEY)
    publisher.start()
    try:
        assert metrics.snapshot_due(_Stats(), draining=False)
        publisher.submit()
        text = wait_until(lambda: client.get(KEY), 10, "the first snapshot").decode()
        assert 'vllm:num_requests_running{model_name="m"} 3.0' in text
        assert 0 < client.pttl(KEY) <= 60_000
        _Stats.num_running = 7
        metrics.snapshot_due(_Stats(), draining=True)
        publisher.submit()
        text = wait_until(
            lambda: b'running{model_name="m"} 7.0' in (client.get(KEY) or b"") and client.get(KEY),
            10, "the second snapshot",
        ).decode()  # fmt: skip
        assert 'fleetlm:worker_draining{model_name="m"} 1.0' in text
        assert publisher.num_published >= 2
    finally:
        publisher.close()
        client.delete(KEY)
        _Stats.num_running = 3


def test_a_failed_write_is_survived_and_nothing_is_written_after_close(services):
    metrics, publisher, client = _publisher(services.redis_url)
    client.delete(KEY)
    # A server that is not there: the write fails for real.
    publisher.client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    publisher.start()
    metrics.snapshot_due(_Stats(), draining=False)
    publisher.submit()
    wait_until(lambda: publisher._failing, 10, "the failed write")
    assert publisher.num_published == 0 and not client.exists(KEY)
    publisher.client = client
    publisher.submit()
    wait_until(lambda: client.exists(KEY), 10, "the write after the failure")
    publisher.close()
    assert not publisher._thread.is_alive()
    client.delete(KEY)
    publisher.submit()
    published = publisher.num_published
    assert not client.exists(KEY) and publisher.num_published == published
