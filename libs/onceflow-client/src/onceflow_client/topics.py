"""Every onceflow topic's name, in the lowest package that holds Python: the client names
`compute.results`, the registry and the dead-letter topics from here, and the core's
`onceflow.topology` (which says who reads and writes each) re-exports it."""

from __future__ import annotations

from enum import StrEnum


class Topic(StrEnum):
    """Every topic's name, before ONCEFLOW_TOPIC_PREFIX (`CommonSettings.topic` adds it). A name
    with a `{job}` slot is a template: one topic per compute job (`job_topic`)."""

    INGEST_RECORDS = "ingest.records"
    INGEST_DLQ = "ingest.dlq"
    ACKER_ACKS = "acker.acks"
    ACKER_EVENTS = "acker.events"
    ACKER_CHANGELOG = "acker.changelog"
    ACKER_DLQ = "acker.dlq"
    DEDUP_RECORDS = "dedup.records"
    DEDUP_CHANGELOG = "dedup.changelog"
    DEDUP_DLQ = "dedup.dlq"
    COMPUTE_PARTIALS = "compute.partials.{job}"
    COMPUTE_RESULTS = "compute.results"
    COMPUTE_CHANGELOG = "compute.changelog.{job}"
    COMPUTE_EVENTTIME = "compute.eventtime"
    COMPUTE_LATE = "compute.late"
    COMPUTE_DLQ = "compute.dlq"
    SINK_DLQ = "sink.dlq"
    SOURCE_DLQ = "source.dlq"
    SOURCE_OFFSETS = "source.offsets"
    JOBS_REGISTRY = "jobs.registry"
    DLQ_REDRIVEN = "dlq.redriven"
    STREAM_READERS = "stream.readers"

    @property
    def per_job(self) -> bool:
        return "{job}" in self.value
