"""What the source refuses before it writes anything (no broker: the cluster lookups are faked)."""

from __future__ import annotations

import pytest

from onceflow.config import CommonSettings
from onceflow_source import service
from onceflow_source.config import SourceSettings

pytestmark = pytest.mark.source
PIPELINE = "127.0.0.1:9"


def settings(**kw: str) -> SourceSettings:
    return SourceSettings(common=CommonSettings(kafka_bootstrap=PIPELINE), **kw)  # type: ignore[arg-type]


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, set[str]]]:
    """bootstrap -> (cluster id, topics) as the fake AdminClients answer."""
    known: dict[str, tuple[str, set[str]]] = {}

    class FakeAdmin:
        def __init__(self, config: dict) -> None:
            self.bootstrap = config["bootstrap.servers"]

    monkeypatch.setattr(service, "AdminClient", FakeAdmin)
    monkeypatch.setattr(service.clients, "admin", lambda common: FakeAdmin({"bootstrap.servers": common.kafka_bootstrap}))
    monkeypatch.setattr(service, "_cluster_id", lambda admin, where: known[admin.bootstrap])
    return known


def test_a_topic_is_required(clusters: dict) -> None:
    with pytest.raises(service.SourceRefused, match="ONCEFLOW_SOURCE_TOPIC is required"):
        service.check_source(settings())


def test_a_topic_on_another_cluster_is_refused_not_copied_without_its_offsets_in_the_transaction(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"orders"})
    clusters["other:9092"] = ("other-id", {"orders"})
    with pytest.raises(service.SourceRefused, match="is not the pipeline's .*not supported yet") as refused:
        service.check_source(settings(topic="orders", bootstrap="other:9092"))
    assert "other-id" in str(refused.value) and "pipeline-id" in str(refused.value)


def test_another_address_of_the_pipelines_own_cluster_is_the_same_cluster(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"orders"})
    clusters["localhost:9"] = ("pipeline-id", {"orders"})
    service.check_source(settings(topic="orders", bootstrap="localhost:9"))
    service.check_source(settings(topic="orders", bootstrap=PIPELINE))
    service.check_source(settings(topic="orders"))


def test_a_missing_topic_is_refused(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"orders"})
    with pytest.raises(service.SourceRefused, match="'payments' does not exist"):
        service.check_source(settings(topic="payments"))


def test_a_refusal_exits_2_with_the_reason(clusters: dict, capsys: pytest.CaptureFixture[str]) -> None:
    clusters[PIPELINE] = ("pipeline-id", set())
    assert service.run(settings(topic="orders")) == 2
    assert "onceflow-source: topic 'orders' does not exist" in capsys.readouterr().err
