"""Composition: settings -> SourceStage on the shared loop over the user's topic -> gRPC (Admin +
health). On the pipeline's cluster the loop subscribes as a group, so the consumed offsets go
into the same transaction as the records they produced (send_offsets_to_transaction). On another
cluster it assigns the partitions itself and writes their positions to `source.offsets` in that
transaction instead (`onceflow.txn.external`, docs/decisions/0017). Either way the intake is
wrapped in the identity rules (`identity.py`): positions stored with the topic's id, checked at
every assignment, and the record ids made with the cluster's and the topic's ids read at start."""

from __future__ import annotations

import logging
import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from onceflow import streams, topology
from onceflow.admin import ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.kafka import clients
from onceflow.kafka.topic_ids import read_topic_id
from onceflow.runner import run_loop_service
from onceflow.service_main import EXIT_USAGE
from onceflow.topology import Topic
from onceflow.state.store import KeyValueStore
from onceflow.trees import EventWatcher, InFlightTrees
from onceflow.txn import TransactionalLoop
from onceflow.txn.driver import GroupIntake
from onceflow.txn.external import ExternalIntake, ExternalTopic
from onceflow_client.kafka_identity import KafkaOrigin, kafka_record_id

from onceflow_source.config import SourceSettings
from onceflow_source.identity import IdentityIntake
from onceflow_source.mapping import Mapping
from onceflow_source.stage import SourceStage

log = logging.getLogger(__name__)
_METADATA_TIMEOUT_S = 15.0


class SourceRefused(Exception):
    """A configuration the source cannot keep exactly-once: it says so and does not start."""


def _cluster_id(admin: AdminClient, where: str) -> tuple[str | None, set[str]]:
    try:
        metadata = admin.list_topics(timeout=_METADATA_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - any failure to reach it is a refusal with the reason
        raise SourceRefused(f"cannot reach {where}: {exc}") from None
    return metadata.cluster_id, set(metadata.topics)


def check_source(settings: SourceSettings) -> ExternalTopic | None:
    """Refuse what cannot start, before anything is written: no topic, a cluster that does not
    answer, a missing topic, a stream that does not exist. Returns the topic's cluster if it is not the pipeline's (another
    cluster id: its offsets cannot join the pipeline's transaction, so its positions go to
    source.offsets instead), else None."""
    if not settings.topic:
        raise SourceRefused("ONCEFLOW_SOURCE_TOPIC is required: the topic to copy")
    common = settings.common
    pipeline_id, topics = _cluster_id(clients.admin(common), f"the pipeline's cluster ({common.kafka_bootstrap})")
    try:
        streams.check_stream_name(settings.stream)
    except ValueError as exc:
        raise SourceRefused(f"ONCEFLOW_SOURCE_STREAM: {exc}") from None
    if common.topic(streams.topic_of(settings.stream)) not in topics:
        raise SourceRefused(f"ONCEFLOW_SOURCE_STREAM: {streams.missing_stream(settings.stream)}")
    external = None
    if settings.bootstrap and settings.bootstrap != common.kafka_bootstrap:
        source_admin = AdminClient(clients.plain_config(settings.bootstrap))
        source_id, topics = _cluster_id(source_admin, f"the source cluster ({settings.bootstrap})")
        if source_id != pipeline_id:
            if not source_id:
                raise SourceRefused(f"the source cluster ({settings.bootstrap}) reports no cluster id")
            external = ExternalTopic(settings.bootstrap, settings.topic, source_id)
    if settings.topic not in topics:
        where = f"the source cluster ({settings.bootstrap})" if external else "the cluster"
        raise SourceRefused(f"topic {settings.topic!r} does not exist on {where}")
    return external


def source_admin(settings: SourceSettings, external: ExternalTopic | None) -> AdminClient:
    """An admin client of the topic's cluster."""
    return clients.admin(settings.common) if external is None else AdminClient(clients.plain_config(external.bootstrap))


def read_origin(settings: SourceSettings, external: ExternalTopic | None, admin: AdminClient | None = None) -> KafkaOrigin:
    """The topic's cluster id and topic id, read once at start for the default record ids. A
    cluster that reports no topic id (a broker before Kafka 2.8) gives "" (written ``-``): the
    fallback identity, said at start with a WARNING."""
    admin = admin or source_admin(settings, external)
    where = "the source cluster" if external else "the cluster"
    cluster_id = external.cluster_id if external else _cluster_id(admin, where)[0] or ""
    try:
        topic_id = read_topic_id(admin, settings.topic, _METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise SourceRefused(f"cannot read the id of topic {settings.topic!r} on {where}: {exc}") from None
    origin = KafkaOrigin(cluster_id, topic_id)
    if not origin.complete:
        log.warning(
            "source: %s reports no %s for topic %s: default record ids fall back to %s, which %s (docs/services/source.md, "
            "\"Record identity\")", where, "topic id" if cluster_id else "cluster id or topic id", settings.topic,
            kafka_record_id(origin, settings.topic, 0, 0).replace("/0/0", "/<partition>/<offset>"),
            "cannot tell a recreated topic from the old one" if cluster_id else "cannot tell this cluster's topic from a "
            "same-named one elsewhere, nor a recreated topic from the old one",
        )
    return origin


def record_id_form(settings: SourceSettings, origin: KafkaOrigin | None = None) -> str:
    """How the source names its records, for the start line."""
    if settings.id_field:
        return f"field {settings.id_field!r}"
    if origin is None:
        return "kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>"
    return kafka_record_id(origin, settings.topic, 0, 0).removesuffix("/0/0") + "/<partition>/<offset>"


def build(
    settings: SourceSettings, external: ExternalTopic | None = None, origin: KafkaOrigin | None = None
) -> tuple[TransactionalLoop[KeyValueStore], ServiceServer, SourceStage]:
    """The loop over the topic; ``external``: the topic is on that other cluster; ``origin``:
    its cluster id and topic id (read here if not given)."""
    common = settings.common
    admin = source_admin(settings, external)
    origin = origin or read_origin(settings, external, admin)
    stage = SourceStage(
        Mapping(settings.limits, settings.id_field, origin, settings.stream, settings.producer),
        common.topic(Topic.INGEST_RECORDS),
        settings.tree_timeout_ms if settings.acking else None,
        InFlightTrees(max_attempts=1) if settings.acking else None,
    )
    inner = (
        GroupIntake(common, settings.group_id_of(topology.SOURCE, job=settings.topic), settings.topic, settings.loop.session_timeout_ms)
        if external is None
        else ExternalIntake(common, external, common.topic(Topic.SOURCE_OFFSETS))
    )
    intake = IdentityIntake(inner, admin, settings.topic, origin)
    loop = TransactionalLoop.for_hop(
        topology.SOURCE, stage, common=common, settings=settings.loop, instance=owner(settings, external),
        job=settings.topic, input_topic=settings.topic, intake=intake,
    )
    intake.stop = loop.stopping
    if stage.trees is not None:
        loop.held = PendingCap(stage.trees, settings.max_pending)

    def gauges() -> dict[str, float]:
        pending = {"trees_in_flight": float(len(stage.trees))} if stage.trees is not None else {}
        return {"copied": float(stage.counts.copied), "dead_lettered": float(stage.counts.dead_lettered), **pending}

    server = ServiceServer.for_service(
        "source", settings, LoopControls(loop, gauges),
    )
    return loop, server, stage


def owner(settings: SourceSettings, external: ExternalTopic | None) -> str:
    """What the source's transactional id is named by: this instance, or for a topic on another
    cluster that cluster's id, so every instance copying it shares the id and the newest fences
    any other (one owner of all its partitions, ADR 0017)."""
    return settings.instance if external is None else external.cluster_id


def transactional_id(settings: SourceSettings, external: ExternalTopic | None) -> str:
    return settings.transactional_id_of(topology.SOURCE, job=settings.topic, instance=owner(settings, external))


def run(settings: SourceSettings) -> int:
    try:
        external = check_source(settings)
    except SourceRefused as exc:
        print(f"onceflow-source: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        origin = read_origin(settings, external)
    except SourceRefused as exc:
        print(f"onceflow-source: {exc}", file=sys.stderr)
        return EXIT_USAGE
    loop, server, stage = build(settings, external, origin)
    watcher = None
    if stage.trees is not None:
        # From acker.events' ends as they are before the first record: every event of a tree
        # this instance starts lies past them.
        watcher = EventWatcher(settings.common, settings.common.topic(Topic.ACKER_EVENTS), stage.trees, name="source")
        watcher.start()
    log.info("source: copying %s%s into %s as %s (record_id: %s)", settings.topic,
             f" from cluster {external.cluster_id} ({external.bootstrap})" if external else "",
             settings.common.topic(Topic.INGEST_RECORDS), transactional_id(settings, external),
             record_id_form(settings, origin))
    try:
        return run_loop_service(loop, server, settings.metrics_port, settings.host)
    finally:
        if watcher is not None:
            watcher.stop()


class PendingCap:
    """The loop's ``held``: True while the trees in flight are at ``max_pending``; says when the
    source stops reading and when it goes on."""

    def __init__(self, trees: InFlightTrees, max_pending: int) -> None:
        self._trees = trees
        self._max = max_pending
        self._holding = False

    def __call__(self) -> bool:
        holding = len(self._trees) >= self._max
        if holding != self._holding:
            self._holding = holding
            if holding:
                log.info("source: %d trees in flight (ONCEFLOW_SOURCE_MAX_PENDING): holding until some end", len(self._trees))
            else:
                log.info("source: %d trees in flight: reading again", len(self._trees))
        return holding
