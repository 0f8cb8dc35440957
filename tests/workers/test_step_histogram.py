# The per-step histogram must expose exactly what prometheus_client's Histogram would for the
# same observations (dashboards and alerts read these series), boundary values included.
import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from workers.gpu.metrics import ITL_BUCKETS
from workers.gpu.step_histogram import StepHistogram


def test_exposition_matches_prometheus_client():
    rng = random.Random(3)
    values = [rng.expovariate(10.0) for _ in range(500)]
    values += [*ITL_BUCKETS, 0.0, 1e9]  # exactly on each bound (le is inclusive), +Inf
    reference = CollectorRegistry()
    plain = Histogram("vllm:x_seconds", "doc", ["model_name"], buckets=ITL_BUCKETS,
                      registry=reference).labels("m")  # fmt: skip
    ours_registry = CollectorRegistry()
    ours = StepHistogram("vllm:x_seconds", "doc", "m", ITL_BUCKETS)
    ours_registry.register(ours)
    for v in values:
        plain.observe(v)
    for start in range(0, len(values), 37):  # in step-sized batches
        ours.observe_many(values[start : start + 37])
    ours.observe_many([])

    def lines(registry):
        text = generate_latest(registry).decode()
        return [line for line in text.splitlines() if not line.startswith("vllm:x_seconds_created")]

    expected, got = lines(reference), lines(ours_registry)
    # _sum may differ in the last bits (numpy sums pairwise): compare it numerically.
    assert [x for x in got if "_sum" not in x] == [x for x in expected if "_sum" not in x]
    (sum_got,) = [float(x.split()[-1]) for x in got if "_sum" in x]
    (sum_expected,) = [float(x.split()[-1]) for x in expected if "_sum" in x]
    assert abs(sum_got - sum_expected) <= 1e-9 * sum_expected
