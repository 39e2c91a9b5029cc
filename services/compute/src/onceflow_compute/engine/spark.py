"""The Spark engine: one long-lived session (classic or Spark Connect, sessions.py) that runs
each micro-batch's job, Arrow in and Arrow out; and the engine over a session someone else owns
(batch mode's callers)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import pyarrow as pa

from onceflow_compute.api import Aggregation, Combine, Join, Transform
from onceflow_compute.config import ComputeSettings
from onceflow_compute.dataflow.windows import time_grain
from onceflow_compute.engine import BUCKET, KEY, ROW, SIDE, TIME, Engine, EngineStalled, EngineUnavailable, partial_columns
from onceflow_compute.engine import cds, sessions
from onceflow_compute.engine.shipping import archive, shippable

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)


class SparkEngine:
    """One long-lived SparkSession, classic or Spark Connect (sessions.py). Each batch: Arrow
    table -> DataFrame -> job -> Arrow."""

    name = "spark"
    _batch_timeout_s = 0.0  # a SessionEngine (someone else's session) waits as Spark does
    _master = ""
    _ship: tuple[str, ...] = ()

    def __init__(
        self, master: str, shuffle_partitions: int, driver_memory: str, app_name: str, java_options: str = "",
        executor_python: str = "", ship: Sequence[str] = (), batch_timeout_s: float = 0.0,
        conf: Mapping[str, str] | None = None,
    ) -> None:
        # 0: wait as long as Spark does (which, with no executor to run on, is forever).
        self._batch_timeout_s = batch_timeout_s
        self._cancelled: set[str] = set()
        self._master, self._ship = master, tuple(ship)
        self._build = lambda: sessions.build_session(
            master, app_name, shuffle_partitions, driver_memory, java_options, conf or {}
        )
        self.session: SparkSession | None = None
        # The Python the executors run. In local mode they are this machine's processes and
        # need this venv; on a cluster, the workers' own Python unless a setting names one (a
        # Connect server's executors: the server's setting).
        if executor_python:
            os.environ["PYSPARK_PYTHON"] = executor_python
        elif master.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        try:
            self._open()
        except EngineUnavailable as exc:
            # A master or Connect server that is down now may be up by the first batch: start
            # anyway (no crash loop); each batch tries again, the service NOT_SERVING meanwhile.
            log.warning("%s; the first batch tries again", exc)

    def _open(self) -> None:
        stale = self.session
        if stale is not None:
            sessions.drop(stale)
        self.session = None
        try:
            session = self._build()
            self._adopt(session)
            self._flavour.quiet()
            for module in self._ship:
                if (source := shippable(module)) is not None:
                    self._flavour.ship(archive(source))
                    log.info("shipped %s (for %s) to the executors", source.name, module)
        except Exception as exc:
            if not self._master.startswith("local"):  # a cluster or server that may come back
                self.session = None
                raise self._unavailable(exc) from exc
            raise
        log.info("Spark %s session on %s", session.version, self._master)

    def _adopt(self, session: SparkSession) -> None:
        self.session = session
        self._flavour = sessions.flavour(session)
        # Arrow input is split into partitions of this many rows.
        self._rows_per_partition = int(session.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") or 10_000)

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """Around a batch: a session lost with its server is opened again first, and an error
        that says Spark is out of reach becomes EngineUnavailable (no record is to blame)."""
        if self.session is None:
            self._open()
        try:
            yield
        except EngineStalled:
            raise
        except Exception as exc:
            if self._master and self._flavour.unavailable(exc):  # a session of our own, lost
                sessions.drop(self.session)
                self.session = None
                raise self._unavailable(exc) from exc
            raise

    def _unavailable(self, exc: Exception) -> EngineUnavailable:
        kind = "Spark Connect" if sessions.is_connect(self._master) else "Spark"
        return EngineUnavailable(f"{kind} at {self._master} is unavailable (a new session is opened for the next batch): {exc}")

    def _collect(self, frame: DataFrame) -> pa.Table:
        """The frame as Arrow, cancelled past the batch timeout (EngineStalled): a batch that
        waits forever for executors would hold its partitions, unnoticed, with the service
        reporting itself healthy."""
        if not self._batch_timeout_s:
            return frame.toArrow()
        flavour = self._flavour
        tag = f"onceflow-batch-{uuid.uuid4().hex}"
        flavour.tag(tag)

        def cancel() -> None:
            self._cancelled.add(tag)
            flavour.cancel(tag)

        timer = threading.Timer(self._batch_timeout_s, cancel)
        timer.daemon = True
        timer.start()
        try:
            return frame.toArrow()
        except Exception as exc:
            if tag in self._cancelled:
                raise EngineStalled(
                    f"Spark did not finish a micro-batch within {self._batch_timeout_s:g} s and it was cancelled: "
                    f"no executor accepted it, or the cluster lost them (is the master at "
                    f"{self._master or 'its master'} up, with workers that have free cores and memory?)"
                ) from exc
            raise
        finally:
            timer.cancel()
            self._cancelled.discard(tag)
            flavour.untag(tag)

    def frame(self, table: pa.Table) -> DataFrame:
        assert self.session is not None  # callers run in _reaching (which opens it) or after a batch that did
        return self.session.createDataFrame(table)

    def partials(self, job: Aggregation, table: pa.Table) -> pa.Table:
        with self._reaching():
            return self._partials(job, table)

    def transform(self, job: Transform, table: pa.Table) -> pa.Table:
        with self._reaching():
            return self._collect(job.transform(self.frame(table)))

    def join_rows(self, job: Join, table: pa.Table) -> pa.Table:
        with self._reaching():
            return self._join_rows(job, table)

    def _partials(self, job: Aggregation, table: pa.Table) -> pa.Table:
        from pyspark.sql import functions as F

        if job.prepare is None:
            # Ship only what the aggregates read: the JVM copy of the batch is most of its cost.
            table = table.select(input_columns(job, table))
        frame = self.frame(table)
        if table.num_rows <= self._rows_per_partition:
            # Already one partition: saying so lets the planner drop the shuffle (one stage).
            frame = frame.coalesce(1)
        if job.prepare is not None:
            frame = job.prepare(frame)
        names = iter(partial_columns(job))
        builtin: list[Column] = []
        udfs: list[Column] = []
        for aggregate in job.aggregates:
            columns = [c.alias(next(names)) for c in aggregate.spark()]
            (udfs if isinstance(aggregate, Combine) else builtin).extend(columns)
        groups = [F.col(job.key).cast("string").alias(KEY)]
        frame = frame.where(F.col(job.key).isNotNull())
        if job.windowed:
            size, offset = time_grain(job.window)
            time = F.col(job.time_column).cast("long")
            groups.append((F.floor((time - offset) / size) * size + offset).cast("long").alias(BUCKET))
            frame = frame.where(time.isNotNull())
        grouped = frame.groupBy(*groups)
        # Spark cannot mix a grouped-aggregate pandas UDF with built-in aggregates in one agg():
        # two aggregations over the same groups, joined on them.
        parts = [grouped.agg(*columns) for columns in (builtin, udfs) if columns]
        on = [KEY, BUCKET] if job.windowed else [KEY]
        result = parts[0] if len(parts) == 1 else parts[0].join(parts[1], on)
        return self._collect(result.select(*on, *partial_columns(job)))

    def _join_rows(self, job: Join, table: pa.Table) -> pa.Table:
        """Both sides' rows of one batch, as (SIDE, KEY, TIME, ROW). Rows without a join key or
        an event time join nothing and are left out (as SQL's inner join would)."""
        from pyspark.sql import functions as F

        from onceflow.v1.compute_pb2 import JoinRow

        frame = self.frame(table)
        if table.num_rows <= self._rows_per_partition:
            frame = frame.coalesce(1)
        sides = []
        for side, build in ((JoinRow.LEFT, job.left), (JoinRow.RIGHT, job.right)):
            rows = build(frame)
            row = F.to_json(F.struct(*[F.col(c) for c in rows.columns]), {"ignoreNullFields": "false"})
            sides.append(
                rows.where(F.col(job.on).isNotNull() & F.col(job.time_column).isNotNull()).select(
                    F.lit(side).alias(SIDE),
                    F.col(job.on).cast("string").alias(KEY),
                    F.col(job.time_column).cast("long").alias(TIME),
                    row.alias(ROW),
                )
            )
        return self._collect(sides[0].unionByName(sides[1]))

    def close(self) -> None:
        if self.session is not None:
            self.session.stop()


def input_columns(job: Aggregation, table: pa.Table) -> list[str]:
    """The columns an aggregation without ``prepare`` reads: its key, aggregated columns and,
    when windowed, its time column."""
    needed = {job.key} | {getattr(a, "column", "") for a in job.aggregates}
    if job.windowed:
        needed.add(job.time_column)
    return [name for name in table.column_names if name in needed]


def spark_engine(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    app_name: str = "onceflow-batch",
    ship: Sequence[str] = (),
    batch_timeout_s: float = 0.0,
    settings: ComputeSettings | None = None,
) -> SparkEngine:
    """A Spark engine configured as the workers' (``settings``, else ONCEFLOW_COMPUTE_SPARK_*,
    unless given)."""
    settings = settings or ComputeSettings()
    return SparkEngine(
        master or settings.spark_master,
        shuffle_partitions or settings.spark_shuffle_partitions,
        driver_memory or settings.spark_driver_memory,
        app_name=app_name,
        java_options=cds.java_options(settings.spark_java_options),
        executor_python=settings.spark_executor_python,
        conf=settings.spark_conf,
        ship=ship,
        batch_timeout_s=batch_timeout_s,
    )


class SessionEngine(SparkEngine):
    """The Spark engine over a session someone else owns (and stops)."""

    def __init__(self, session: SparkSession) -> None:
        # Not SparkEngine.__init__: that builds a session.
        self._adopt(session)

    def close(self) -> None:
        pass


def as_engine(session_or_engine: SparkSession | Engine) -> Engine:
    if hasattr(session_or_engine, "partials") and hasattr(session_or_engine, "transform"):
        return cast(Engine, session_or_engine)  # the hasattr checks above do not narrow the union
    if hasattr(session_or_engine, "createDataFrame"):  # a classic or a Spark Connect session
        return SessionEngine(session_or_engine)
    raise TypeError(f"expected a SparkSession or an engine, got {type(session_or_engine).__name__}")
