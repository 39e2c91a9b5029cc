"""Kafka output topic settings: ONCEFLOW_SINK_KAFKA_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from onceflow.config import CommonSettings, LoopSettings, ServiceSettings


class KafkaOutputSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_SINK_KAFKA_", extra="ignore")

    common: CommonSettings = Field(
        default_factory=CommonSettings,
        description="The Kafka ones (the pipeline's cluster, where `compute.results` is; an output topic on another "
        "cluster is reached with the same security settings), the topic prefix, the transaction timeout, the tokens, "
        "TLS and the log level; it needs no Redis.",
    )
    loop: LoopSettings = Field(
        default_factory=LoopSettings,
        description="The loop over `compute.results`: each batch's output records and the consumed offsets (or, to "
        "another cluster, the positions in `sink.kafka.offsets` there) commit in one transaction.",
    )
    job: str = Field(
        default="",
        description="The job whose result table is written (required): a job's name or a version's (`orders@2`); only "
        "the changes of exactly that name are taken.",
    )
    topic: str = Field(
        default="",
        description="The output topic (required), as named on its cluster: no topic prefix is added. Created compacted, "
        "with as many partitions as `compute.results`, if it does not exist.",
    )
    format: Literal["json"] = Field(
        default="json",
        description="How a row is written: `json`, the row as compute wrote it (a JSON object; anything else goes to "
        "`sink.dlq`).",
    )
    bootstrap: str = Field(
        default="",
        description="The output topic's cluster; empty: the pipeline's (`ONCEFLOW_KAFKA_BOOTSTRAP`). On another cluster "
        "(another cluster id) the consumed positions are records of `sink.kafka.offsets` on that cluster, written in the "
        "same transaction as the outputs, and its dead letters go to `sink.dlq` there.",
    )
    port: int = Field(
        default=0, ge=0, le=65535,
        description="The gRPC port: Admin, health, reflection. 0 (the default) picks a free one: one process runs per "
        "job and topic, so no fixed port would do for all.",
    )
    metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus `/metrics`; 0 (the default) disables it.")
    instance: str = Field(
        default="sink-kafka-0",
        description="This process's name in logs and Admin. It does not name the transactional.id: every instance "
        "writing a job's table to a topic of a cluster shares `onceflow-sink-kafka/<job>/<topic>/<target cluster id>`, so "
        "the newest fences any other (one owner).",
    )
