"""The clusters and topics of a Kafka output: which cluster the output topic is on, and the topics
it needs there, created if missing (the output compacted, with compute.results' partition count;
on another cluster, the positions topic and the dead letters' topic too)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.topics import TopicSpec, ensure_topics
from onceflow.topology import Topic

log = logging.getLogger(__name__)
_TIMEOUT_S = 15.0
# On another cluster: the positions of compute.results' partitions, one compacted partition keyed
# `<pipeline cluster id>/<compute.results>/<job>/<output topic>/<partition>` (before the prefix).
POSITIONS_TOPIC = "sink.kafka.offsets"


class OutputRefused(Exception):
    """A configuration the output cannot keep exactly once, or cannot reach: it says so and does not start."""


@dataclass(frozen=True)
class Clusters:
    """Where the output reads and where it writes. ``target`` is the pipeline's settings with the
    output's bootstrap (the same security settings); ``external``: another cluster id."""

    pipeline_id: str
    results_partitions: int
    target: CommonSettings
    target_id: str
    external: bool


def _cluster(admin: AdminClient, where: str) -> tuple[str, dict[str, int]]:
    """The cluster's id and its topics' partition counts."""
    try:
        metadata = admin.list_topics(timeout=_TIMEOUT_S)
    except KafkaException as exc:
        raise OutputRefused(f"cannot reach {where}: {exc}") from None
    if not metadata.cluster_id:
        raise OutputRefused(f"{where} reports no cluster id")
    return metadata.cluster_id, {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


def resolve(common: CommonSettings, bootstrap: str) -> Clusters:
    """The pipeline's cluster (compute.results must be there) and the output's."""
    results = common.topic(Topic.COMPUTE_RESULTS)
    pipeline_id, topics = _cluster(clients.admin(common), f"the pipeline's cluster ({common.kafka_bootstrap})")
    if not topics.get(results):
        raise OutputRefused(f"{results} does not exist on the pipeline's cluster (run `onceflow infra topics`)")
    if not bootstrap or bootstrap == common.kafka_bootstrap:
        return Clusters(pipeline_id, topics[results], common, pipeline_id, external=False)
    target = common.model_copy(update={"kafka_bootstrap": bootstrap})
    target_id, _ = _cluster(clients.admin(target), f"the output's cluster ({bootstrap})")
    # Another address of the same cluster is the same cluster: one transaction holds both.
    external = target_id != pipeline_id
    return Clusters(pipeline_id, topics[results], target if external else common, target_id, external)


def prepare(clusters: Clusters, topic: str) -> None:
    """Create what the output writes to, if missing: the output topic (compacted, as many
    partitions as compute.results), and on another cluster the positions and dead letters'
    topics. An existing output topic is taken as it is, with a WARNING if it is not compacted."""
    target = clusters.target
    admin = clients.admin(target)
    try:
        existing = admin.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
    except KafkaException as exc:
        raise OutputRefused(f"cannot read topic {topic!r}: {exc}") from None
    missing = existing is None or existing.error is not None or not existing.partitions
    specs = [TopicSpec(topic, clusters.results_partitions, compacted=True)] if missing else []
    if clusters.external:
        specs += [TopicSpec(target.topic(POSITIONS_TOPIC), 1, compacted=True), TopicSpec(target.topic(Topic.SINK_DLQ), 1)]
    created: list[str] = []
    if specs:
        try:
            created = ensure_topics(target.kafka_bootstrap, specs=specs)
        except (KafkaException, ValueError, TimeoutError) as exc:
            raise OutputRefused(f"cannot create {', '.join(s.name for s in specs)}: {exc}") from None
        for name in created:
            log.info("created topic %s on %s", name, target.kafka_bootstrap)
    if topic not in created:  # it existed (metadata may lag a creation: then the create said so)
        partitions = len(admin.list_topics(topic, timeout=_TIMEOUT_S).topics[topic].partitions)
        _check_existing(admin, topic, partitions, clusters.results_partitions)


def _check_existing(admin: AdminClient, topic: str, partitions: int, results_partitions: int) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        config = admin.describe_configs([resource], request_timeout=_TIMEOUT_S)[resource].result()
    except KafkaException as exc:
        raise OutputRefused(f"cannot read the configuration of topic {topic!r}: {exc}") from None
    entry = config.get("cleanup.policy")
    policy = entry.value if entry is not None else "delete"
    if policy != "compact":
        # Not refused: every change is still written exactly once. But a reader that builds the
        # table from the start finds it only while retention keeps every row's last change.
        log.warning(
            "output topic %s has cleanup.policy=%s, not compact: each change is still written once, but retention "
            "will delete rows' last changes, and a reader rebuilding the table from the topic's start then misses "
            "those rows (kafka-configs --alter --add-config cleanup.policy=compact makes it a table)", topic, policy)
    if partitions != results_partitions:
        log.info("output topic %s has %d partitions (compute.results: %d): rows are placed by key either way",
                 topic, partitions, results_partitions)
