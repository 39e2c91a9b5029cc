"""Compute worker settings: ONCEFLOW_COMPUTE_* (plus the common ONCEFLOW_* and ONCEFLOW_LOOP_*)."""

from __future__ import annotations

import enum

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings

# A job's two hops, by the name the service and its admin calls use.
_HOPS = {"map": topology.COMPUTE_MAP, "merge": topology.COMPUTE_MERGE}


class EngineName(str, enum.Enum):
    SPARK = "spark"
    PANDAS = "pandas"  # the benchmark's in-process baseline: aggregations without prepare only


class ComputeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_COMPUTE_", extra="ignore")

    common: CommonSettings = Field(default_factory=CommonSettings)
    # The merge hop batches as ONCEFLOW_LOOP_* say; the map hop's bounds are below.
    loop: LoopSettings = Field(default_factory=LoopSettings)
    # A built-in job (wordcount, usersum, bigspend) or an importable module defining `job`.
    job: str = "usersum"
    host: str = "127.0.0.1"
    port: int = Field(default=15054, ge=0, le=65535)
    metrics_port: int = Field(default=9104, ge=0, le=65535)
    # Stable across restarts: the transactional ids derive from it.
    instance: str = "compute-0"
    engine: EngineName = EngineName.SPARK
    # Spark: any master URL (local[*], spark://host:7077, ...). Small-memory defaults.
    spark_master: str = "local[*]"
    spark_shuffle_partitions: int = Field(default=2, ge=1)
    spark_driver_memory: str = "1g"
    # The Python Spark's executors run. Empty: in local mode this venv's; on a cluster
    # (spark://...) what Spark picks (PYSPARK_PYTHON, else python3 on the workers).
    spark_executor_python: str = ""
    # Any other Spark settings, as JSON ({"spark.cores.max": "1"}): on a shared standalone
    # cluster each worker is one application, and without spark.cores.max the first takes every
    # core and the next waits for ever. Through Spark Connect only runtime (SQL) settings apply.
    spark_conf: dict[str, str] = Field(default_factory=dict)
    # More JVM options for the Spark driver (the AppCDS archive `make setup` builds is always
    # used when present). Short-lived workers start faster with "-XX:TieredStopAtLevel=1
    # -XX:+UseSerialGC" (the fault tests use it); long-lived ones run faster without.
    spark_java_options: str = ""
    # A micro-batch Spark has not finished by then is cancelled and fails as a whole: the
    # service turns NOT_SERVING and retries with backoff, instead of waiting forever for
    # executors that never come. Below the consumer's max.poll.interval.ms (300 s). 0: never.
    batch_timeout_s: float = Field(default=120.0, ge=0, le=290)
    # The map hop's micro-batch: adaptive between these bounds (Spark costs ~0.1-0.2 s per
    # job in local mode, so big batches amortise it under load; small ones keep latency low).
    min_batch_records: int = Field(default=500, ge=1)
    max_batch_records: int = Field(default=20_000, ge=1)
    max_batch_ms: int = Field(default=200, ge=1)
    # The map hop's linger after a first record: longer than the other hops' 5 ms, since each
    # batch costs a Spark job.
    linger_ms: int = Field(default=20, ge=0)
    # Engine runs spent finding the records a failing job raises on, per batch.
    bisect_budget: int = Field(default=64, ge=1)
    # Event time: how far out of order the input may be (watermark = newest event time seen -
    # this bound, per partition), and how long a silent partition keeps holding it back.
    watermark_bound_ms: int = Field(default=5_000, ge=0)
    idle_timeout_ms: int = Field(default=30_000, ge=1)

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
            }
        )

    def transactional_id(self, job: str, hop: str) -> str:
        return _HOPS[hop].transactional_id(self.common.topic_prefix, self.instance, job)

    def group_id(self, job: str, hop: str) -> str:
        """One consumer group per job and hop: the workers of a job split its partitions."""
        return _HOPS[hop].group_id(self.common.topic_prefix, job)
