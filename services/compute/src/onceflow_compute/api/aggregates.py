"""The aggregates of an :class:`~onceflow_compute.api.kinds.Aggregation`: each a combiner in four
parts (init/add as Spark columns over one micro-batch, merge and result over partials in the
worker), so any split of the stream into batches gives the same table."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from onceflow_compute.api.rows import JSONValue

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column


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
        # Any: pyspark's overloads of pandas_udf have no form that takes the kind from the
        # function's type hints (a function and a return type only), as this call does.
        udf: Any = pandas_udf
        return [udf(fold, "string")(self.column)]

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
