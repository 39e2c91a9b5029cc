"""Sink settings: ONCEFLOW_SINK_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from onceflow import topology
from onceflow.config import (
    CommonSettings,
    LoopSettings,
    ServiceSettings,
    grpc_port_setting,
    instance_setting,
    metrics_port_setting,
)


class SinkSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_SINK_", extra="ignore")

    common: CommonSettings = Field(
        default_factory=CommonSettings,
        description="The result tables live in Redis (`ONCEFLOW_REDIS_*`; a `redis+sentinel://` URL follows a Sentinel "
        "failover: docs/redis.md); the sink also uses the Kafka ones, the topic prefix, the transaction timeout, "
        "the tokens, TLS and the log level.",
    )
    loop: LoopSettings = Field(
        default_factory=LoopSettings,
        description="How the sink batches `compute.results` (records per poll, the longest idle wait for a first "
        "record, the wait for more after it) and backs off while Redis is unavailable.",
    )
    port: int = grpc_port_setting(topology.SINK_SERVICE)
    metrics_port: int = metrics_port_setting(topology.SINK_SERVICE)
    instance: str = instance_setting(topology.SINK_SERVICE)
    store: Literal["redis", "postgres"] = Field(
        default="redis",
        description="Where the result tables live: `redis` (`ONCEFLOW_REDIS_*`), or `postgres` (`ONCEFLOW_POSTGRES_URL`: "
        "one SQL table per job, docs/services/sink.md). Both answer Query the same way and are kept exactly once "
        "by the same fenced, offset-checked apply.",
    )
    acking: bool = Field(
        default=True,
        description="Ack the applied changes' anchors to the acker, which ends their trees (off when nothing tracks the "
        "trees).",
    )
