# /metrics: vLLM-named engine series from every worker (labelled by worker) and fleetlm's own
# series on the API, present and moving under traffic; a worker's own port serves the same names.
# The API port's /metrics needs an admin key (its series name tenants); the scraper reads the
# API's metrics listener.
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.timeout(120)

VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
VLLM_COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
VLLM_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
)


def scrape(url: str, key: str | None = None) -> dict[str, list]:
    """family name → samples; counters keep their `_total` sample names."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(url, headers=headers, timeout=10)
    r.raise_for_status()
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(r.text)}


def total(families, sample_name: str, **labels) -> float:
    name = sample_name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    _, samples = families.get(name, (None, []))
    return sum(
        s.value
        for s in samples
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_api_port_metrics_need_an_admin_key(fleet):
    url = fleet.base_url + "/metrics"
    assert httpx.get(url, timeout=10).status_code == 401
    tenant = {"Authorization": f"Bearer {fleet.key}"}
    assert httpx.get(url, headers=tenant, timeout=10).status_code == 403
    assert "fleetlm:queue_depth" in scrape(url, fleet.admin_key)
    listener = f"http://127.0.0.1:{fleet.metrics_port}"
    assert httpx.get(listener + "/v1/models", headers=tenant, timeout=10).status_code == 404


def test_api_metrics_carry_every_worker_and_move_under_traffic(fleet):
    url = f"http://127.0.0.1:{fleet.metrics_port}/metrics"  # the scraper's listener: no key
    wait_until(lambda: len(scrape(url).get("vllm:num_requests_running", (0, []))[1]) == 2, 20,
               "both workers' series on the API's /metrics")  # fmt: skip
    before = scrape(url)
    client = fleet.openai()
    messages = [{"role": "user", "content": "Tell me a story."}]
    for _ in range(2):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    for _ in client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, stream=True
    ):
        pass
    small = fleet.create_tenant("ops-small", "--tpm", "10")
    limited = openai.OpenAI(base_url=fleet.base_url + "/v1", api_key=small, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        limited.chat.completions.create(model="tiny", messages=messages, max_tokens=64)

    def moved():
        after = scrape(url)
        done = total(after, "vllm:request_success_total", finished_reason="length")
        return after if done >= total(before, "vllm:request_success_total") + 3 else None

    after = wait_until(moved, 15, "the workers' snapshots to show the requests", 0.25)

    for name in VLLM_GAUGES:
        assert after[name][0] == "gauge", name
        assert {s.labels["worker"] for s in after[name][1]} == set(
            s.labels["worker"] for s in after["vllm:num_requests_running"][1]
        )
        assert all(s.labels["model_name"] == "tiny" for s in after[name][1])
    workers = {s.labels["worker"] for s in after["vllm:num_requests_running"][1]}
    assert len(workers) == 2
    for name in VLLM_COUNTERS:
        assert after[name][0] == "counter", name
        found = {s.labels["worker"] for s in after[name][1]}
        # A series per finish reason exists once a worker finished a request: routing may have
        # sent every request of this test to the worker holding the prompt's prefix.
        some = name == "vllm:request_success" and found and found <= workers
        assert found == workers or some, name
    for name in VLLM_HISTOGRAMS:
        assert after[name][0] == "histogram", name
        assert any(s.name == name + "_bucket" and s.labels["le"] == "+Inf" for s in after[name][1])
    for sample in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert total(after, sample) > total(before, sample), sample
    for name in VLLM_HISTOGRAMS:
        assert total(after, name + "_count") > total(before, name + "_count"), name

    # fleetlm's own
    assert {s.labels["priority"] for s in after["fleetlm:queue_depth"][1]} == {
        "interactive",
        "batch",
    }
    assert {s.labels["worker"] for s in after["fleetlm:worker_heartbeat_age_seconds"][1]} == workers
    assert total(after, "fleetlm:workers_live") == 2
    assert after["fleetlm:metering_lag_seconds"][0] == "gauge"
    assert (
        total(after, "fleetlm:admissions_total", tenant="demo")
        >= total(before, "fleetlm:admissions_total", tenant="demo") + 3
    )
    assert total(after, "fleetlm:rejections_total", tenant="ops-small", status="429") == 1
    assert {s.labels["worker"] for s in after["fleetlm:gpu_busy_fraction"][1]} == workers
    assert total(after, "fleetlm:engine_busy_seconds_total") > 0


def test_worker_serves_its_own_metrics_port(fleet):
    families = scrape(f"http://127.0.0.1:{fleet.worker_metrics_port}/metrics")
    for name in (*VLLM_GAUGES, *VLLM_COUNTERS, *VLLM_HISTOGRAMS):
        assert name in families, name
    assert all("worker" not in s.labels for s in families["vllm:num_requests_running"][1])
