"""The job API: what a user writes (docs/jobs.md).

A job is a Python module with a module-level ``job``: one of

- an :class:`Aggregation`: an optional stateless ``prepare`` (DataFrame -> DataFrame), then a
  group key and aggregates whose partial state per key lives in the changelog-backed store;
- a :class:`Transform`: a stateless DataFrame -> DataFrame whose rows are the results;
- a :class:`Join`: two stateless sides (DataFrame -> DataFrame) joined on a column, both sides'
  rows kept per join key in the changelog-backed store, retracting what a later row changes.

Every aggregate is a combiner in four parts (init/add as Spark columns over one micro-batch,
merge and result over partials in the worker), so any split of the stream into batches gives
the same table: merge is associative and commutative, and the result depends on the merged
partial alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from onceflow_compute.dataflow.joins import JoinKind
from onceflow_compute.dataflow.panes import Accumulation, Trigger
from onceflow_compute.dataflow.windows import GLOBAL, GlobalWindows, Hopping, Sessions, Tumbling, Window, WindowFn

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame

JSONValue = Any

# A windowed job's rows carry their window.
WINDOW_START = "window_start"
WINDOW_END = "window_end"

__all__ = [
    "Accumulation", "Aggregation", "Avg", "Combine", "Combiner", "Count", "GlobalWindows", "Hopping", "Join", "JoinKind",
    "Max", "Min", "Sessions", "Sum", "Transform", "Trigger", "Tumbling",
]

# Columns the worker adds next to the payload fields, for prepare/transform to use.
METADATA_COLUMNS = pa.schema(
    [
        pa.field("_record_id", pa.string(), nullable=False),
        pa.field("_key", pa.string()),
        pa.field("_event_time_ms", pa.int64()),
        pa.field("_ingest_time_ms", pa.int64()),
    ]
)


class Aggregate:
    """One output column of an aggregation. Subclasses say how a batch's partial is computed
    (Spark columns, pandas for the baseline engine) and how partials merge."""

    name: str

    def spark(self) -> list[Column]:
        raise NotImplementedError

    def pandas(self, groups: pd.core.groupby.DataFrameGroupBy) -> list[pd.Series]:
        raise NotImplementedError

    def partial(self, values: Sequence[JSONValue]) -> JSONValue:
        """The partial from this aggregate's columns of one batch row."""
        return values[0]

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue:
        raise NotImplementedError

    def result(self, partial: JSONValue) -> JSONValue:
        return partial

    @property
    def width(self) -> int:
        """How many batch columns :meth:`spark` and :meth:`pandas` produce."""
        return 1

    def describe(self) -> str:
        return f"{self.name}={type(self).__name__.lower()}"


def _none_aware(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """SQL semantics: nulls are skipped, and an aggregate over nothing but nulls is null."""

    def merged(a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return op(a, b)

    return merged


@dataclass(frozen=True)
class Count(Aggregate):
    name: str = "count"

    def spark(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.count(F.lit(1))]

    def pandas(self, groups: pd.core.groupby.DataFrameGroupBy) -> list[pd.Series]:
        return [groups.size()]

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue:
        return a + b


@dataclass(frozen=True)
class _ColumnAggregate(Aggregate):
    column: str
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", f"{type(self).__name__.lower()}_{self.column}")

    def describe(self) -> str:
        return f"{self.name}={type(self).__name__.lower()}({self.column})"


@dataclass(frozen=True)
class Sum(_ColumnAggregate):
    def spark(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.sum(self.column)]

    def pandas(self, groups: pd.core.groupby.DataFrameGroupBy) -> list[pd.Series]:
        return [groups[self.column].sum(min_count=1)]

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue:
        return _none_aware(lambda x, y: x + y)(a, b)


@dataclass(frozen=True)
class Min(_ColumnAggregate):
    def spark(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.min(self.column)]

    def pandas(self, groups: pd.core.groupby.DataFrameGroupBy) -> list[pd.Series]:
        return [groups[self.column].min()]

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue:
        return _none_aware(min)(a, b)


@dataclass(frozen=True)
class Max(_ColumnAggregate):
    def spark(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.max(self.column)]

    def pandas(self, groups: pd.core.groupby.DataFrameGroupBy) -> list[pd.Series]:
        return [groups[self.column].max()]

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue:
        return _none_aware(max)(a, b)


@dataclass(frozen=True)
class Avg(_ColumnAggregate):
    """Partial [sum, count]: an average of averages would be wrong."""

    @property
    def width(self) -> int:
        return 2

    def spark(self) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.sum(self.column), F.count(self.column)]

    def pandas(self, groups: pd.core.groupby.DataFrameGroupBy) -> list[pd.Series]:
        return [groups[self.column].sum(min_count=1), groups[self.column].count()]

    def partial(self, values: Sequence[JSONValue]) -> JSONValue:
        return [values[0], values[1]]

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue:
        return [_none_aware(lambda x, y: x + y)(a[0], b[0]), a[1] + b[1]]

    def result(self, partial: JSONValue) -> JSONValue:
        total, count = partial
        return None if not count else total / count


class Combiner(Protocol):
    """A user-defined aggregate. Accumulators must be JSON values (they go to the changelog)."""

    def init(self) -> JSONValue: ...

    def add(self, acc: JSONValue, value: Any) -> JSONValue: ...

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue: ...

    def result(self, acc: JSONValue) -> JSONValue: ...


@dataclass(frozen=True)
class Combine(_ColumnAggregate):
    """Runs a :class:`Combiner` over a column: ``add`` folds one batch's values per key in a
    Spark pandas UDF (Python, so slower than the built-ins); ``merge`` joins partials."""

    combiner: Combiner | None = None

    def _fold(self, values: pd.Series) -> str:
        assert self.combiner is not None
        acc = self.combiner.init()
        for value in values:
            acc = self.combiner.add(acc, None if value is None or value != value else _plain(value))
        return json.dumps(acc)

    def spark(self) -> list[Column]:
        import pandas as pd
        from pyspark.sql.functions import pandas_udf

        def fold(values: pd.Series) -> str:
            return self._fold(values)

        # Spark picks the UDF's kind (Series -> scalar: a grouped aggregate) from real type
        # hints; this module's postponed annotations would hand it strings.
        fold.__annotations__ = {"values": pd.Series, "return": str}
        return [pandas_udf(fold, "string")(self.column)]  # type: ignore[call-overload]

    def pandas(self, groups: pd.core.groupby.DataFrameGroupBy) -> list[pd.Series]:
        return [groups[self.column].agg(self._fold)]

    def partial(self, values: Sequence[JSONValue]) -> JSONValue:
        return json.loads(values[0])

    def merge(self, a: JSONValue, b: JSONValue) -> JSONValue:
        assert self.combiner is not None
        return self.combiner.merge(a, b)

    def result(self, partial: JSONValue) -> JSONValue:
        assert self.combiner is not None
        return self.combiner.result(partial)

    def describe(self) -> str:
        return f"{self.name}={type(self.combiner).__name__}({self.column})"


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones, so combiners see JSON-able values."""
    return value.item() if hasattr(value, "item") else value


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
    kind: str = field(default="aggregation", init=False)

    def __post_init__(self) -> None:
        names = [a.name for a in self.aggregates]
        if not self.aggregates or len(set(names)) != len(names) or self.key in names:
            raise ValueError(f"job {self.name}: needs aggregates with distinct names, none named like the key")
        if set(names) & {WINDOW_START, WINDOW_END}:
            raise ValueError(f"job {self.name}: {WINDOW_START} and {WINDOW_END} are the window's columns")
        if self.allowed_lateness_ms < 0:
            raise ValueError(f"job {self.name}: allowed_lateness_ms must be >= 0")
        if not self.windowed and self.trigger != Trigger():
            raise ValueError(f"job {self.name}: a job without a window refines its rows at every batch; it takes no trigger")

    @property
    def windowed(self) -> bool:
        return not isinstance(self.window, GlobalWindows)

    def row(self, key: str, partials: Sequence[JSONValue]) -> dict[str, JSONValue]:
        row: dict[str, JSONValue] = {self.key: key}
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


@dataclass(frozen=True)
class Transform:
    name: str
    schema: pa.Schema
    # Result key column of the output rows; each row is an upsert of that key.
    key: str
    transform: Callable[[DataFrame], DataFrame]
    doc: str = ""
    kind: str = field(default="transform", init=False)


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
    kind: str = field(default="join", init=False)

    def __post_init__(self) -> None:
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
        row: dict[str, JSONValue] = {"left": left, "right": right}
        if self.windowed:
            row.update({WINDOW_START: window.start, WINDOW_END: window.end})
        return row

    def result_key(self, left: dict[str, JSONValue] | None, right: dict[str, JSONValue] | None, window: Window) -> str:
        def id_of(side: dict[str, JSONValue] | None, column: str) -> str:
            return "" if side is None else str(side.get(column))

        key = f"{id_of(left, self.left_id)}|{id_of(right, self.right_id)}"
        return f"{key}@{window.label()}" if self.windowed else key


Job = Aggregation | Transform | Join


def encode_json(value: JSONValue) -> bytes:
    """Compact and key-ordered, so equal rows are equal bytes (the sink compares bytes)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
