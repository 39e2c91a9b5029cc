"""The three kinds of job: :class:`Aggregation`, :class:`Transform` and :class:`Join`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from onceflow import streams

from onceflow_compute.api.aggregates import Aggregate
from onceflow_compute.api.rows import WINDOW_END, WINDOW_START, JSONValue
from onceflow_compute.dataflow.joins import JoinKind
from onceflow_compute.dataflow.panes import Accumulation, Trigger
from onceflow_compute.dataflow.windows import GLOBAL, GlobalWindows, Tumbling, Window, WindowFn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Aggregation:
    name: str
    # The payload fields (JSON objects). Non-nullable fields are required.
    schema: pa.Schema
    # The group key column, after prepare. Results are keyed by its string form.
    key: str
    aggregates: tuple[Aggregate, ...]
    # Stateless, per micro-batch: e.g. split lines into words. Must keep the key column (and,
    # for a windowed job, the time column).
    prepare: Callable[[DataFrame], DataFrame] | None = None
    doc: str = ""
    # Event time (docs/jobs.md#event-time). Without a window the job keeps one running row per
    # key, refined at every batch; with one, a row per key and window, fired by the trigger.
    window: WindowFn = field(default_factory=GlobalWindows)
    trigger: Trigger = field(default_factory=Trigger)
    accumulation: Accumulation = Accumulation.RETRACTING
    allowed_lateness_ms: int = 0
    # The column holding each record's event time (ms): the envelope's, or a payload field.
    time_column: str = "_event_time_ms"
    # The stream the job reads (docs/decisions/0025): it never sees another stream's records.
    stream: str = streams.DEFAULT
    # False: the key only names the row in the table, not a column of it (a SQL job's composite
    # key, whose parts are columns of their own).
    show_key: bool = True
    # Which rows are in the result table (SQL's HAVING): a row that stops passing is retracted,
    # one that starts passing is upserted. Pure and deterministic, like every part of a job.
    having: Callable[[dict[str, JSONValue]], bool] | None = None
    kind: str = field(default="aggregation", init=False)

    def __post_init__(self) -> None:
        streams.check_stream_name(self.stream)
        names = [a.name for a in self.aggregates]
        if not self.aggregates or len(set(names)) != len(names) or self.key in names:
            raise ValueError(f"job {self.name}: needs aggregates with distinct names, none named like the key")
        if set(names) & {WINDOW_START, WINDOW_END}:
            raise ValueError(f"job {self.name}: {WINDOW_START} and {WINDOW_END} are the window's columns")
        if self.allowed_lateness_ms < 0:
            raise ValueError(f"job {self.name}: allowed_lateness_ms must be >= 0")
        if not self.windowed and self.trigger != Trigger():
            raise ValueError(f"job {self.name}: a job without a window refines its rows at every batch; it takes no trigger")
        if self.having is not None and self.accumulation is not Accumulation.RETRACTING:
            raise ValueError(f"job {self.name}: having= needs the retracting accumulation (a row that stops passing is retracted)")

    @property
    def windowed(self) -> bool:
        return not isinstance(self.window, GlobalWindows)

    def row(self, key: str, partials: Sequence[JSONValue]) -> dict[str, JSONValue]:
        row: dict[str, JSONValue] = {self.key: key} if self.show_key else {}
        for aggregate, partial in zip(self.aggregates, partials, strict=True):
            row[aggregate.name] = aggregate.result(partial)
        return row

    def window_row(self, key: str, window: Window, partials: Sequence[JSONValue]) -> dict[str, JSONValue]:
        return {**self.row(key, partials), WINDOW_START: window.start, WINDOW_END: window.end}

    def result_key(self, key: str, window: Window, pane: int = 0) -> str:
        """A windowed row's key in the result table: ``key@start-end`` (discarding panes are
        rows of their own: ``key@start-end#pane``)."""
        label = f"{key}@{window.label()}"
        return f"{label}#{pane}" if self.accumulation is Accumulation.DISCARDING else label

    def merge(self, a: Sequence[JSONValue], b: Sequence[JSONValue]) -> list[JSONValue]:
        return [agg.merge(x, y) for agg, x, y in zip(self.aggregates, a, b, strict=True)]

    def shown(self, row: dict[str, JSONValue] | None) -> dict[str, JSONValue] | None:
        """``row`` if the result table holds it (``having``), else None."""
        if row is None or self.having is None or self.having(row):
            return row
        return None


@dataclass(frozen=True)
class Transform:
    name: str
    schema: pa.Schema
    # Result key column of the output rows; each row is an upsert of that key.
    key: str
    transform: Callable[[DataFrame], DataFrame]
    doc: str = ""
    stream: str = streams.DEFAULT
    kind: str = field(default="transform", init=False)

    def __post_init__(self) -> None:
        streams.check_stream_name(self.stream)


@dataclass(frozen=True)
class Join:
    """A stream-stream equi-join (docs/jobs.md#joins). ``left`` and ``right`` turn a micro-batch
    into each side's rows; both must have the ``on`` column, their id column (unique per row:
    result keys are built from it) and the ``time_column``. Windowed (tumbling), two rows join
    only within one window, and a window's rows are dropped once the watermark passes its end
    plus the allowed lateness; with the global window every row is kept (an incremental join).

    A result row is ``{"left": {...} | null, "right": {...} | null}`` (plus the window's bounds
    when windowed), keyed ``left_id|right_id`` (empty for a null side, ``@start-end`` appended
    when windowed). An outer side's row without partners is emitted padded with null and
    retracted when its first partner arrives."""

    name: str
    schema: pa.Schema
    left: Callable[[DataFrame], DataFrame]
    right: Callable[[DataFrame], DataFrame]
    on: str
    left_id: str
    right_id: str
    how: JoinKind = JoinKind.INNER
    window: WindowFn = field(default_factory=GlobalWindows)
    allowed_lateness_ms: int = 0
    time_column: str = "_event_time_ms"
    doc: str = ""
    # Both sides come from this one stream.
    stream: str = streams.DEFAULT
    # The result row from the two sides' rows (either may be None: an outer join's padding);
    # None: ``{"left": ..., "right": ...}``. A SQL join's flat SELECT list.
    project: Callable[[dict[str, JSONValue] | None, dict[str, JSONValue] | None], dict[str, JSONValue]] | None = None
    kind: str = field(default="join", init=False)

    def __post_init__(self) -> None:
        streams.check_stream_name(self.stream)
        if not isinstance(self.window, (Tumbling, GlobalWindows)):
            raise ValueError(f"job {self.name}: a join's window is tumbling or global")
        if self.allowed_lateness_ms < 0:
            raise ValueError(f"job {self.name}: allowed_lateness_ms must be >= 0")

    @property
    def windowed(self) -> bool:
        return not isinstance(self.window, GlobalWindows)

    @property
    def key(self) -> str:
        """The join column: the key a join's state is kept (and looked up) by."""
        return self.on

    @property
    def retention_ms(self) -> int | None:
        """How far behind the watermark a row stays joinable: its window plus the lateness
        (no later record of that window passes the event-time gate)."""
        if isinstance(self.window, Tumbling):
            return self.window.size_ms + self.allowed_lateness_ms
        return None

    def window_of(self, event_time_ms: int) -> Window:
        return self.window.assign(event_time_ms)[0]

    def join_key(self, on_value: str, window: Window) -> str:
        return f"{on_value}@{window.label()}" if self.windowed else on_value

    def window_of_key(self, join_key: str) -> Window:
        if not self.windowed:
            return GLOBAL
        start, end = join_key.rpartition("@")[2].split("-")
        return Window(int(start), int(end))

    def row(self, left: dict[str, JSONValue] | None, right: dict[str, JSONValue] | None, window: Window) -> dict[str, JSONValue]:
        row: dict[str, JSONValue] = {"left": left, "right": right} if self.project is None else self.project(left, right)
        if self.windowed:
            row.update({WINDOW_START: window.start, WINDOW_END: window.end})
        return row

    def result_key(self, left: dict[str, JSONValue] | None, right: dict[str, JSONValue] | None, window: Window) -> str:
        def id_of(side: dict[str, JSONValue] | None, column: str) -> str:
            return "" if side is None else str(side.get(column))

        key = f"{id_of(left, self.left_id)}|{id_of(right, self.right_id)}"
        return f"{key}@{window.label()}" if self.windowed else key


Job = Aggregation | Transform | Join
