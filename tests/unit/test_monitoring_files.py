"""The optional monitoring profile (docker/compose.monitoring.yml): Prometheus scrapes every
Loom service, and Grafana's dashboard asks only for metrics the services export. No image can
be pulled here, so the stack itself is not run in tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "docker" / "monitoring"
# Names given to prometheus_client (Counter, Histogram) or BusyClock in the source.
DEFINED = re.compile(r'(?:Counter|Histogram|Gauge|BusyClock)\(\s*"(loom_[a-z_]+)"')
USED = re.compile(r"\b(loom_[a-z_]+)")
SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def exported_metrics() -> set[str]:
    names: set[str] = set()
    for package in ("gateway", "services", "modelstate"):
        for path in (ROOT / package).rglob("*.py"):
            names.update(DEFINED.findall(path.read_text()))
    return names


def test_the_dashboard_asks_only_for_exported_metrics() -> None:
    dashboard = json.loads((MONITORING / "grafana/dashboards/loom.json").read_text())
    exported = exported_metrics()
    assert {"loom_http_requests", "loom_http_request_seconds", "loom_tracker_points"} <= exported
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            used.update(USED.findall(target["expr"]))
    base = {next((n.removesuffix(s) for s in SUFFIXES if n.endswith(s)), n) for n in used}
    assert base and base <= exported, base - exported
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_prometheus_scrapes_every_loom_service_where_compose_runs_it() -> None:
    env = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-loom-env"]
    urls = {
        v.removeprefix("http://")
        for k, v in env.items()
        if re.fullmatch(r"LOOM_[A-Z]+_URL", k) and k != "LOOM_DATABASE_URL"
    }
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    targets = {
        t
        for job in config["scrape_configs"]
        for group in job["static_configs"]
        for t in group["targets"]
    }
    assert targets == urls


def test_the_profile_is_optional_and_mounts_files_that_exist() -> None:
    compose = yaml.safe_load((ROOT / "docker/compose.monitoring.yml").read_text())
    for name, spec in compose["services"].items():
        assert spec["profiles"] == ["monitoring"], name
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    assert [n for n, s in compose["services"].items() if "ports" in s] == ["grafana"]
