"""Composition: settings -> SourceStage on the shared loop over the user's topic -> gRPC (Admin +
health). The loop subscribes on the pipeline's cluster, so the consumed offsets go into the
same transaction as the records they produced (send_offsets_to_transaction)."""

from __future__ import annotations

import logging
import sys

from confluent_kafka.admin import AdminClient

from onceflow.admin import ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.kafka import clients
from onceflow.runner import run_loop_service
from onceflow.service_main import EXIT_USAGE
from onceflow.topology import Topic
from onceflow.state.store import KeyValueStore
from onceflow.txn import TransactionalLoop

from onceflow_source.config import SourceSettings
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


def check_source(settings: SourceSettings) -> None:
    """Refuse what would not be exactly-once, before anything is written: no topic; a topic on
    another cluster (its offsets could not be part of the pipeline's transaction, and copying
    with offsets kept outside it could lose or duplicate records after a crash); a missing topic."""
    if not settings.topic:
        raise SourceRefused("ONCEFLOW_SOURCE_TOPIC is required: the topic to copy")
    common = settings.common
    pipeline_id, topics = _cluster_id(clients.admin(common), f"the pipeline's cluster ({common.kafka_bootstrap})")
    if settings.bootstrap and settings.bootstrap != common.kafka_bootstrap:
        source_admin = AdminClient(clients.plain_config(settings.bootstrap))
        source_id, topics = _cluster_id(source_admin, f"the source cluster ({settings.bootstrap})")
        if source_id != pipeline_id:
            raise SourceRefused(
                f"the topic's cluster ({settings.bootstrap}, id {source_id}) is not the pipeline's "
                f"({common.kafka_bootstrap}, id {pipeline_id}): a source on another cluster cannot commit its offsets "
                "in the pipeline's transaction, so it is not supported yet (docs/services/source.md); copy the topic "
                "onto the pipeline's cluster first (e.g. MirrorMaker 2) and read it there"
            )
    if settings.topic not in topics:
        raise SourceRefused(f"topic {settings.topic!r} does not exist on the cluster")


def build(settings: SourceSettings) -> tuple[TransactionalLoop[KeyValueStore], ServiceServer, SourceStage]:
    common = settings.common
    stage = SourceStage(
        Mapping(settings.limits, settings.id_field),
        common.topic(Topic.INGEST_RECORDS),
        settings.tree_timeout_ms if settings.acking else None,
    )
    loop = TransactionalLoop(
        stage=stage,
        common=common,
        settings=settings.loop,
        input_topic=settings.topic,
        group_id=settings.group_id,
        transactional_id=settings.transactional_id,
        dlq_topic=common.topic(Topic.SOURCE_DLQ),
    )

    def gauges() -> dict[str, float]:
        return {"copied": float(stage.counts.copied), "dead_lettered": float(stage.counts.dead_lettered)}

    server = ServiceServer.for_service(
        "source", settings, LoopControls(loop, gauges),
    )
    return loop, server, stage


def run(settings: SourceSettings) -> int:
    try:
        check_source(settings)
    except SourceRefused as exc:
        print(f"onceflow-source: {exc}", file=sys.stderr)
        return EXIT_USAGE
    loop, server, _stage = build(settings)
    log.info("source: copying %s into %s as %s (record_id: %s)", settings.topic,
             settings.common.topic(Topic.INGEST_RECORDS), settings.transactional_id,
             f"field {settings.id_field!r}" if settings.id_field else "topic/partition/offset")
    return run_loop_service(loop, server, settings.metrics_port, settings.host)
