# The deployment files parse, every container runs a real `fleetlm` subcommand (checked against
# fleetlm.cli's own parser), and the dashboard and alerts only use series fleetlm exports.
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from fleetlm.cli import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# The containers' subcommands; `celery` comes from the batch-files work (fleetlm/celery_cmd.py).
EXPECTED = {"migrate", "api", "worker", "metering", "celery"}
SERVICES = {"postgres", "redis", "migrate", "api", "gpu-worker", "metering", "celery-worker",
            "celery-beat", "prometheus", "grafana"}  # fmt: skip
EXPORTED = re.compile(r"\b(vllm|fleetlm):[a-z0-9_]+")
# Read from Redis at scrape time by every API replica (api/metrics.py _fleet_families).
FLEET_WIDE = (
    "fleetlm:queue_depth", "fleetlm:queue_in_progress", "fleetlm:workers_live",
    "fleetlm:metering_lag_seconds", "fleetlm:worker_heartbeat_age_seconds",
)  # fmt: skip


def assert_fleetlm_command(argv: list[str]) -> None:
    assert argv[0] == "fleetlm", argv
    assert argv[1] in SUBCOMMANDS, argv
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"`{' '.join(argv)}` does not parse: exit {exc.code}")


def test_compose_services_and_commands():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == SERVICES
    used = set()
    for svc in services.values():
        cmd = svc.get("command")
        if isinstance(cmd, list) and cmd and cmd[0] == "fleetlm":
            assert_fleetlm_command(cmd)
            used.add(cmd[1])
    assert used == EXPECTED
    assert services["redis"]["command"] == [
        "redis-server", "--appendonly", "yes", "--appendfsync", "always"
    ]  # fmt: skip
    assert services["postgres"]["image"] == "postgres:16"
    assert services["redis"]["image"].startswith("redis:7")
    for name in ("postgres", "redis"):
        assert "healthcheck" in services[name] and services[name]["volumes"]
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert services["migrate"]["restart"] == "no"
    for mount in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
        source = mount.split(":")[0]
        if source.startswith("./"):
            assert (ROOT / source).exists(), source
    for svc in services.values():
        build = svc.get("build")
        if build:
            assert (ROOT / build["dockerfile"]).exists()


def test_k8s_manifests_parse_and_run_fleetlm_subcommands():
    k8s = DEPLOY / "k8s"
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    docs = []
    for resource in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((k8s / resource).read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "StatefulSet", "Job", "Service", "ScaledObject"} <= kinds
    used = set()
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                assert_fleetlm_command(container["command"])
                used.add(container["command"][1])
    assert used == EXPECTED
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "fleetlm-gpu-worker"
    # Prometheus triggers on the fleet-wide queue gauges (they count the routed queues too),
    # max over the API replicas that all report the same value.
    triggers = scaled["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"prometheus"}
    names = exported_names()
    queried = set()
    for t in triggers:
        query = t["metadata"]["query"]
        assert query.startswith("max(") and float(t["metadata"]["threshold"]) > 0, query
        series = [m.group(0) for m in EXPORTED.finditer(query)]
        assert series and set(series) <= names, query
        queried |= {(s, p) for s in series for p in re.findall(r'priority="(\w+)"', query)}
    assert {("fleetlm:queue_depth", "interactive"), ("fleetlm:queue_depth", "batch"),
            ("fleetlm:queue_in_progress", "interactive")} <= queried  # fmt: skip


def exported_names() -> set[str]:
    from api import metrics as api_metrics
    from workers.gpu.metrics import WorkerMetrics

    names = set()
    for registry in (api_metrics.REGISTRY, WorkerMetrics("m").registry):
        for family in registry.collect():
            names.add(family.name)
    source = (ROOT / "api" / "metrics.py").read_text()
    names |= set(re.findall(r'"(fleetlm:[a-z_]+)"', source))
    return names


def test_dashboard_and_alerts_use_exported_series():
    names = exported_names()
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "fleetlm.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    alerts = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    exprs += [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    for expr in exprs:
        for m in EXPORTED.finditer(expr):
            series = re.sub(r"_(total|bucket|count|sum)$", "", m.group(0))
            assert series in names, f"{m.group(0)} in {expr!r}"
    # The fleet's Redis-side gauges are the same on every API replica: never summed over them.
    fleet_wide = "|".join(FLEET_WIDE)
    for expr in exprs:
        summed = rf"sum\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\(\s*(?:{fleet_wide})\b"
        assert not re.search(summed, expr), expr
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for wanted in ("queue depth", "kv cache", "ttft", "tpot", "tokens/s", "preemptions", "429",
                   "metering lag"):  # fmt: skip
        assert wanted in titles, wanted
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["metrics_path"] == "/metrics"


@pytest.mark.parametrize("image", ["api", "worker"])
def test_images_copy_every_package_the_project_installs(image):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    dockerfile = (DEPLOY / "docker" / f"{image}.Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, re.M))
    assert packages <= copied, f"{image}.Dockerfile misses {sorted(packages - copied)}"


def test_prometheus_scrapes_the_api_metrics_listener():
    # The API port's /metrics needs an admin key (its series name tenants); the examples scrape
    # the keyless listener, which they keep off the published ports.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    metrics_port = api["environment"]["FLEETLM_METRICS_PORT"]
    assert all(not p.startswith(f"{metrics_port}:") for p in api.get("ports", []))
    job = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"][0]
    assert [c["port"] for c in job["dns_sd_configs"]] == [int(metrics_port)]
    k8s = list(yaml.safe_load_all((DEPLOY / "k8s" / "api.yaml").read_text()))
    container = k8s[0]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(env["FLEETLM_METRICS_PORT"])
    monitor = yaml.safe_load((DEPLOY / "k8s" / "monitoring.yaml").read_text())
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
