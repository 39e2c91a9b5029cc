"""Compute worker settings: ONCEFLOW_COMPUTE_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_*)."""

from __future__ import annotations

import enum

from pydantic import Field, model_validator
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

# A job's two hops, by the name the service and its admin calls use.


class EngineName(str, enum.Enum):
    SPARK = "spark"
    PANDAS = "pandas"  # the benchmark's in-process baseline: aggregations without prepare only


class ComputeSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_COMPUTE_", extra="ignore")

    common: CommonSettings = Field(
        default_factory=CommonSettings,
        description="Compute uses the Kafka ones, the topic prefix, the transaction timeout, the tokens, TLS and the "
        "log level; it needs no Redis.",
    )
    loop: LoopSettings = Field(
        default_factory=LoopSettings,
        description="The merge hop batches as these say; the map hop's batch bounds are the `ONCEFLOW_COMPUTE_*` ones. "
        "Both hops back off, time out commits and keep their group sessions by these, and only the merge hop of a "
        "windowed job with early firings punctuates (for early panes when no partials arrive).",
    )
    job: str = Field(
        default="usersum",
        description="A built-in job (`auctionbids`, `nexmark_q0` … `nexmark_q5`, `nexmark_q7`, `nexmark_q8`, `wordcount`, "
        "`usersum`, `bigspend`), a dotted module path defining `job` (or `sql`), or a SQL job: `sql:path/to/file.sql`, or a "
        "built-in one, `sql:nexmark_q0` … `sql:nexmark_q3`, `sql:nexmark_q7` (docs/sql.md); Tilt and compose run `auctionbids`.",
    )
    version: int = Field(
        default=0,
        ge=0,
        le=999_999,
        description="The job's version: 0 runs it under its plain name, as always; N runs it as `<job>@N`, with groups, "
        "topics, state and table of its own (`onceflow job deploy` sets it; docs/jobs.md#versions-and-bluegreen).",
    )
    create_stream: bool = Field(
        default=False,
        description="Create the stream the job reads when it does not exist (an operator's choice, as `onceflow stream "
        "create`); false: a job naming a missing stream is refused at start (exit 2), naming it.",
    )
    partitions: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Partitions of the job's own topics when this worker creates them (a rescale: `onceflow job deploy "
        "--partitions N`); 0: as infra/topics.toml declares. Topics that exist keep theirs.",
    )
    port: int = grpc_port_setting(topology.COMPUTE_SERVICE)
    metrics_port: int = metrics_port_setting(topology.COMPUTE_SERVICE)
    instance: str = instance_setting(topology.COMPUTE_SERVICE)
    engine: EngineName = Field(
        default=EngineName.SPARK,
        description="`spark`, or `pandas`: the benchmark's in-process baseline, for aggregations without `prepare` only.",
    )
    spark_master: str = Field(
        default="local[*]",
        description="`local[…]`, `spark://…` (classic: the driver in this process) or `sc://host:port` (Spark "
        "Connect: the driver in the server).",
    )
    spark_shuffle_partitions: int = Field(
        default=2,
        ge=1,
        description="`spark.sql.shuffle.partitions` and `spark.default.parallelism` (small batches need few).",
    )
    spark_driver_memory: str = Field(default="1g", description="`spark.driver.memory` (a small-memory default).")
    spark_executor_python: str = Field(
        default="",
        description="The Python Spark's executors run. Empty: this venv's in local mode; on a cluster what Spark picks "
        "(`PYSPARK_PYTHON`, else `python3` on the workers).",
    )
    # On a shared standalone cluster each worker is one application, and without spark.cores.max
    # the first takes every core and the next waits for ever.
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description='Any other Spark settings, as JSON (`{"spark.cores.max": "1"}`), applied last; through Spark '
        "Connect only runtime (SQL) settings take.",
    )
    spark_java_options: str = Field(
        default="",
        description="More JVM options for the Spark driver (the AppCDS archive `make setup` builds is always used when "
        "present). Short-lived workers start faster with `-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`; long-lived "
        "ones run faster without.",
    )
    batch_timeout_s: float = Field(
        default=120.0,
        ge=0,
        le=290,
        description="A Spark micro-batch not finished by then is cancelled and fails as a whole: the service turns "
        "`NOT_SERVING` and retries with backoff, instead of waiting forever for executors that never come. Below "
        "the consumer's `max.poll.interval.ms` (300 s); 0: wait forever.",
    )
    # Spark costs ~0.1-0.2 s per job in local mode, so big batches amortise it under load; small
    # ones keep latency low.
    min_batch_records: int = Field(
        default=500,
        ge=1,
        description="The map hop's batch bound adapts between this and `ONCEFLOW_COMPUTE_MAX_BATCH_RECORDS`: it doubles "
        "after a full batch and halves after one under a quarter full.",
    )
    max_batch_records: int = Field(
        default=20_000, ge=1, description="The map hop's upper batch bound (at least the lower one, checked at startup)."
    )
    max_batch_ms: int = Field(
        default=200, ge=1, description="The map hop's longest idle wait for a first record in one poll."
    )
    linger_ms: int = Field(
        default=5,
        ge=0,
        description="After a first record, how long the map hop waits for more before it runs the batch. It applies only "
        "once the hop has caught up: under load the records that came during the last Spark job make the batch.",
    )
    min_cycle_ms: int = Field(
        default=0,
        ge=0,
        le=10_000,
        description="Under load, the least time from one map batch's start to the next's (the batch takes records "
        "until then unless its bound fills): fewer Spark jobs, and fewer partials, one per key per batch, for the "
        "merge hop and the sink. Idle records are never held by it. 0: off.",
    )
    bisect_budget: int = Field(
        default=64, ge=1, description="Engine runs per batch spent finding the records a failing job raises on."
    )
    watermark_bound_ms: int = Field(
        default=5_000,
        ge=0,
        description="How far out of order the input may be: a partition's watermark is the newest event time of its "
        "committed input minus this.",
    )
    idle_timeout_ms: int = Field(
        default=30_000,
        ge=1,
        description="A partition silent this long (or since it was assigned) stops holding the worker's watermark back.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ComputeSettings:
        if self.min_batch_records > self.max_batch_records:
            raise ValueError(
                f"ONCEFLOW_COMPUTE_MIN_BATCH_RECORDS ({self.min_batch_records}) exceeds "
                f"ONCEFLOW_COMPUTE_MAX_BATCH_RECORDS ({self.max_batch_records})"
            )
        return self

    @property
    def map_loop(self) -> LoopSettings:
        return self.loop.model_copy(
            update={
                "min_batch_records": self.min_batch_records,
                "max_batch_records": self.max_batch_records,
                "max_batch_ms": self.max_batch_ms,
                "linger_ms": self.linger_ms,
                "min_cycle_ms": self.min_cycle_ms,
            }
        )
