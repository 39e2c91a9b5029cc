"""Kafka source settings: ONCEFLOW_SOURCE_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_* ones)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings, ServiceSettings, grpc_port_setting, metrics_port_setting
from onceflow.spout import Limits


class SourceSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_SOURCE_", extra="ignore")

    common: CommonSettings = Field(
        default_factory=CommonSettings,
        description="The source uses the Kafka ones (the pipeline's cluster; a source topic on another cluster is "
        "reached with the same security settings), the topic prefix, the transaction timeout, the tokens, TLS and the log level; it needs no Redis.",
    )
    loop: LoopSettings = Field(
        default_factory=LoopSettings,
        description="The source's loop over the user's topic: each batch's records, their INITs and the consumed "
        "offsets (or, from another cluster, its positions in `source.offsets`) commit in one transaction.",
    )
    topic: str = Field(
        default="",
        description="The user's topic to copy (required), as named on the cluster: no topic prefix is added.",
    )
    bootstrap: str = Field(
        default="",
        description="Where the topic lives; empty: the pipeline's cluster (`ONCEFLOW_KAFKA_BOOTSTRAP`). On another "
        "cluster (another cluster id) the source assigns every partition itself and keeps its positions in "
        "`source.offsets` on the pipeline's cluster, in the same transaction as the records; one instance copies the "
        "topic, and a second one fences the first.",
    )
    id_field: str = Field(
        default="",
        description="Empty: record_id is the record's place, `kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>`. "
        "Else the field of the JSON value that holds the record_id, taken as it is (a dotted path reaches into nested "
        "objects); records without it go to `source.dlq`.",
    )
    stream: str = Field(
        default="",
        description="The stream the copied records belong to (docs/decisions/0025); empty: the default stream. It must "
        "exist (`onceflow stream create`): the source refuses to start otherwise.",
    )
    producer: str = Field(
        default="",
        description="A producer name for the copied records (docs/decisions/0027): the gate then scopes their record_ids by "
        "it, so no ingest caller can drop them by sending their ids first. Empty: unscoped, as before. Changing it on a "
        "source that has copied records makes a replay of those records new ones: set it on a new source, or once the "
        "dedup horizon has passed since its last copy.",
        pattern=r"^([A-Za-z0-9_.:-]{1,100})?$",
    )
    port: int = grpc_port_setting(topology.SOURCE_SERVICE)
    metrics_port: int = metrics_port_setting(topology.SOURCE_SERVICE)
    instance: str = Field(
        default="source-0",
        description="A name stable across restarts: the transactional.id `onceflow-source-<topic>-<instance>` derives "
        "from it, so a restarted instance fences its own zombie. A topic on another cluster is copied by one instance "
        "whatever its name: its transactional.id is `onceflow-source-<topic>-<source cluster id>`.",
    )
    acking: bool = Field(
        default=True,
        description="Start each record's tuple tree as ingest does: its INIT goes to the acker with the record, so "
        "the acker tracks it; `false` when the pipeline runs without acking.",
    )
    tree_timeout_ms: int = Field(
        default=30_000, ge=100,
        description="A tree not fully acked within this is TIMED_OUT (replayed only if ingest runs with "
        "`ONCEFLOW_INGEST_REPLAY`).",
    )
    max_pending: int = Field(
        default=50_000, ge=1,
        description="Storm's max.spout.pending, as for ingest: the source's trees in flight (with acking). At the cap it "
        "reads nothing more of the topic (state HELD) until trees complete or time out, so a topic's backlog never "
        "floods the acker and the hops behind it.",
    )
    max_payload_bytes: int = Field(
        default=256 * 1024,
        ge=1,
        le=900 * 1024,
        description="A record's value; a bigger one goes to `source.dlq`. At most 900 KiB, as for ingest.",
    )
    max_key_bytes: int = Field(default=4096, ge=1, description="A record's key; a bigger one goes to `source.dlq`.")
    max_record_bytes: int = Field(
        default=512 * 1024,
        ge=1,
        le=900 * 1024,
        description="The whole record as written to `ingest.records`, headers included; a bigger one goes to "
        "`source.dlq`.",
    )

    @property
    def limits(self) -> Limits:
        return Limits(self.max_payload_bytes, self.max_key_bytes, max_record_bytes=self.max_record_bytes)
