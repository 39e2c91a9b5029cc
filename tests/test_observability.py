"""What a team with Prometheus and Grafana gets (infra/prometheus, infra/grafana): a scrape
config on the services' own metrics ports, and a dashboard that queries only metrics that
docs/metrics.md documents and that a running pipeline serves (the live scrape runs in
tests/test_console.py, on the pipeline the console's browser tests watch)."""

from __future__ import annotations

import json
import re
import urllib.request

import yaml

from onceflow.config import repo_root

DASHBOARD = repo_root() / "infra" / "grafana" / "onceflow.json"
SCRAPE_CONFIG = repo_root() / "infra" / "prometheus" / "prometheus.yml"
# A histogram is queried through its series; docs/metrics.md names the histogram.
_HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def dashboard_metrics() -> set[str]:
    exprs = [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]]
    return {_HISTOGRAM_SERIES.sub("", name) for expr in exprs for name in re.findall(r"\bonceflow_[a-z_]+", expr)}


def default_metrics_ports() -> dict[str, int]:
    from onceflow_acker.config import AckerSettings
    from onceflow_compute.config import ComputeSettings
    from onceflow_dedup.config import DedupSettings
    from onceflow_ingest.config import IngestSettings
    from onceflow_sink.config import SinkSettings

    classes = {
        "ingest": IngestSettings, "acker": AckerSettings, "dedup": DedupSettings, "compute": ComputeSettings,
        "sink": SinkSettings,
    }
    return {name: int(cls.model_fields["metrics_port"].default) for name, cls in classes.items()}


def test_the_dashboard_queries_only_documented_metrics() -> None:
    documented = set(re.findall(r"`(onceflow_[a-z_]+)", (repo_root() / "docs" / "metrics.md").read_text()))
    queried = dashboard_metrics()
    assert len(queried) >= 12, queried
    assert queried <= documented, f"queried but not in docs/metrics.md: {sorted(queried - documented)}"


def test_the_scrape_config_has_each_service_on_its_default_metrics_port() -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    jobs = {job["job_name"]: [t for c in job["static_configs"] for t in c["targets"]] for job in config["scrape_configs"]}
    assert jobs == {f"onceflow-{name}": [f"127.0.0.1:{port}"] for name, port in default_metrics_ports().items()}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
