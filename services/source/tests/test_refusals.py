"""What the source refuses before it writes anything (no broker: the cluster lookups are faked)."""

from __future__ import annotations

import time

import pytest

from onceflow.config import CommonSettings
from onceflow.txn.external import ExternalTopic
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
    def cluster_id(admin: FakeAdmin, where: str) -> tuple[str, set[str]]:
        cluster, topics = known[admin.bootstrap]
        # The pipeline's cluster holds its streams' topics (the default one's, and "orders"').
        return cluster, topics | ({"dedup.records", "dedup.records.orders"} if admin.bootstrap == PIPELINE else set())

    monkeypatch.setattr(service, "_cluster_id", cluster_id)
    return known


def test_a_topic_is_required(clusters: dict) -> None:
    with pytest.raises(service.SourceRefused, match="ONCEFLOW_SOURCE_TOPIC is required"):
        service.check_source(settings())


def test_a_topic_on_another_cluster_is_copied_with_its_positions_keyed_by_that_cluster(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"orders"})
    clusters["other:9092"] = ("other-id", {"orders"})
    external = service.check_source(settings(topic="orders", bootstrap="other:9092"))
    assert external == ExternalTopic("other:9092", "orders", "other-id")
    assert external.position_key(2) == b"other-id/orders/2"
    # One owner of every partition: the id names the topic and its cluster, not the instance.
    ids = {service.transactional_id(settings(topic="orders", instance=name), external) for name in ("a", "b")}
    assert ids == {"onceflow-source-orders-other-id"}


def test_a_topic_missing_on_the_other_cluster_is_refused(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"orders"})
    clusters["other:9092"] = ("other-id", {"payments"})
    with pytest.raises(service.SourceRefused, match="'orders' does not exist on the source cluster"):
        service.check_source(settings(topic="orders", bootstrap="other:9092"))


def test_another_address_of_the_pipelines_own_cluster_is_the_same_cluster(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"orders"})
    clusters["localhost:9"] = ("pipeline-id", {"orders"})
    assert service.check_source(settings(topic="orders", bootstrap="localhost:9")) is None
    assert service.check_source(settings(topic="orders", bootstrap=PIPELINE)) is None
    assert service.check_source(settings(topic="orders")) is None


def test_a_stream_that_does_not_exist_or_cannot_is_refused(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"src"})
    assert service.check_source(settings(topic="src", stream="orders")) is None
    with pytest.raises(service.SourceRefused, match="no stream 'ordres'.*onceflow stream create ordres"):
        service.check_source(settings(topic="src", stream="ordres"))
    with pytest.raises(service.SourceRefused, match="ONCEFLOW_SOURCE_STREAM: stream name 'a.b'"):
        service.check_source(settings(topic="src", stream="a.b"))


def test_a_missing_topic_is_refused(clusters: dict) -> None:
    clusters[PIPELINE] = ("pipeline-id", {"orders"})
    with pytest.raises(service.SourceRefused, match="'payments' does not exist"):
        service.check_source(settings(topic="payments"))


def test_a_refusal_exits_2_with_the_reason(clusters: dict, capsys: pytest.CaptureFixture[str]) -> None:
    clusters[PIPELINE] = ("pipeline-id", set())
    assert service.run(settings(topic="orders")) == 2
    assert "onceflow-source: topic 'orders' does not exist" in capsys.readouterr().err


def test_an_unreachable_source_cluster_is_refused_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "_METADATA_TIMEOUT_S", 2.0)
    admin = service.AdminClient({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})  # nothing listens there
    started = time.monotonic()
    with pytest.raises(service.SourceRefused, match=r"cannot reach the source cluster \(127.0.0.1:1\): .*transport"):
        service._cluster_id(admin, "the source cluster (127.0.0.1:1)")
    assert time.monotonic() - started < 10
