"""What a team with Prometheus and Grafana gets (infra/prometheus, infra/grafana): a scrape
config on the services' own metrics ports, and a dashboard that queries only metrics that
docs/metrics.md documents and that a running pipeline serves."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from onceflow_client import IngestClient
from onceflow.config import CommonSettings, repo_root
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.verify.supervisor import SERVICES, Supervisor
from onceflow_tools.workloads import usersum
from tests.conftest import SHORT_LIVED_COMPUTE, TEST_SESSION_TIMEOUT_MS, eventually, free_port

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


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def _sample(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.integration
def test_every_dashboard_metric_shows_up_in_a_live_scrape_of_a_running_pipeline(infra: None, tmp_path: Path) -> None:
    """The five services on metrics ports of their own, usersum records and one that is not
    JSON sent through; each service counts what it took in, the sink what it applied, compute
    the dead letter, and every metric the dashboard queries is served by some service."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    ports = {name: free_port() for name in SERVICES}
    supervisor = Supervisor(
        prefix, tmp_path,
        settings={name: {"METRICS_PORT": str(port)} for name, port in ports.items()},
        env={
            "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            **SHORT_LIVED_COMPUTE,
        },
    )
    try:
        supervisor.start_all()
        records = usersum.ingest_records(usersum.records(300, users=20, id_prefix="metrics"))
        poison = IngestRecord(record_id=b"metrics-poison", key=b"u0", payload=b"not json")
        with IngestClient(supervisor.address("ingest")) as client:
            assert client.ingest([*records, poison]).accepted == 301

        def scrapes() -> dict[str, str]:
            return {name: _scrape(port) for name, port in ports.items()}

        def applied_and_dead_lettered() -> dict[str, str] | None:
            texts = scrapes()
            done = _sample(texts["sink"], "onceflow_records_out_total", service="sink") > 0
            lettered = _sample(texts["compute"], "onceflow_dead_letters_total", service="compute") >= 1
            return texts if done and lettered else None

        texts = eventually(applied_and_dead_lettered, 180, "the sink's first applies and compute's dead letter")
        for name in SERVICES:
            assert _sample(texts[name], "onceflow_records_in_total", service=name) > 0, (name, texts[name][-3000:])
        served = {m for text in texts.values() for m in re.findall(r"^# TYPE (onceflow_[a-z_]+) ", text, re.M)}
        missing = {metric for metric in dashboard_metrics() if metric not in served and metric + "_total" not in served}
        assert not missing, f"the dashboard queries metrics no service serves: {sorted(missing)}"
        assert _sample(texts["acker"], "onceflow_acker_trees_total", outcome="completed") > 0, texts["acker"][-3000:]
    finally:
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)
