"""A HAVING condition as a Python predicate over a result row.

The merge hop decides, per row it would emit, whether the row is in the table: HAVING filters
the *result* table, so a row that stops passing is retracted and one that starts passing is
upserted. The merge hop works on rows (JSON values), not Spark frames, so the analysed
condition is compiled here into a small evaluator with SQL's rules: NULL propagates through
arithmetic and comparisons, AND/OR/NOT are three-valued, and a row is kept only when the
condition is TRUE. Only what a HAVING over aggregates needs is mapped; the rest is refused,
naming the construct.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from onceflow_compute.api import JSONValue
from onceflow_compute.sql.text import SqlError

Row = dict[str, JSONValue]
Evaluate = Callable[[Row], Any]

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "EqualTo": operator.eq, "LessThan": operator.lt, "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt, "GreaterThanOrEqual": operator.ge,
}
ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "Add": operator.add, "Subtract": operator.sub, "Multiply": operator.mul,
}
INTEGRAL = {"tinyint", "smallint", "int", "bigint"}
FRACTIONAL = {"float", "double"}


def compile_having(condition: Any, columns: set[str]) -> Callable[[Row], bool]:
    """``condition`` (Spark's analysed expression over the Aggregate's output) as a predicate;
    ``columns``: the result columns it may read."""
    evaluate = _compile(condition, columns)

    def having(row: Row) -> bool:
        return evaluate(row) is True

    return having


def _compile(node: Any, columns: set[str]) -> Evaluate:
    name = node.nodeName()
    children = [node.children().apply(i) for i in range(node.children().size())]
    if name == "AttributeReference":
        column = node.name()
        if column not in columns:
            raise SqlError(f"HAVING reads {column}: HAVING filters on the aggregates the SELECT names; "
                           "a condition on a GROUP BY column or the window belongs in WHERE")
        return lambda row: row.get(column)
    if name == "Literal":
        value = _literal(node)
        return lambda _row: value
    if name == "Cast":
        return _cast(_compile(children[0], columns), node.dataType().simpleString())
    parts = [_compile(child, columns) for child in children]
    if name in COMPARISONS:
        return _binary(COMPARISONS[name], *parts)
    if name in ARITHMETIC:
        return _binary(ARITHMETIC[name], *parts)
    if name == "Divide":  # SQL: x / 0 is NULL
        return _binary(lambda a, b: None if b == 0 else a / b, *parts)
    if name == "Remainder":
        return _binary(_remainder, *parts)
    if name == "EqualNullSafe":
        left, right = parts
        return lambda row: left(row) == right(row)
    if name == "UnaryMinus":
        (inner,) = parts
        return lambda row: None if (v := inner(row)) is None else -v
    if name == "Abs":
        (inner,) = parts[:1]
        return lambda row: None if (v := inner(row)) is None else abs(v)
    if name in ("IsNull", "IsNotNull"):
        (inner,) = parts
        return (lambda row: inner(row) is None) if name == "IsNull" else (lambda row: inner(row) is not None)
    if name == "Not":
        (inner,) = parts
        return lambda row: None if (v := inner(row)) is None else not v
    if name == "And":
        return _and(*parts)
    if name == "Or":
        return _or(*parts)
    if name in ("In", "InSet"):
        if name == "InSet":
            raise SqlError("HAVING ... IN with a long list is not supported: compare with OR")
        return _in(parts[0], parts[1:])
    raise SqlError(f"HAVING {node.sql()}: {node.prettyName()} is not supported in HAVING (comparisons, AND, OR, NOT, "
                   "+ - * / %, IS [NOT] NULL and IN over the selected aggregates are)")


def _literal(node: Any) -> Any:
    value = node.value()
    kind = node.dataType().simpleString()
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if kind.startswith("decimal"):
        return float(value.toString())
    if kind == "string":
        return value.toString()
    raise SqlError(f"HAVING: a literal of type {kind.upper()} is not supported")


def _cast(inner: Evaluate, kind: str) -> Evaluate:
    if kind in INTEGRAL:
        return lambda row: None if (v := inner(row)) is None else int(v)  # Spark truncates toward zero too
    if kind in FRACTIONAL or kind.startswith("decimal"):
        return lambda row: None if (v := inner(row)) is None else float(v)
    if kind == "string":
        return lambda row: None if (v := inner(row)) is None else str(v)
    if kind == "boolean":
        return inner
    raise SqlError(f"HAVING: a cast to {kind.upper()} is not supported")


def _binary(function: Callable[[Any, Any], Any], left: Evaluate, right: Evaluate) -> Evaluate:
    def evaluate(row: Row) -> Any:
        a, b = left(row), right(row)
        return None if a is None or b is None else function(a, b)

    return evaluate


def _remainder(a: Any, b: Any) -> Any:
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):  # SQL's sign follows the dividend
        return abs(a) % abs(b) * (1 if a >= 0 else -1)
    import math

    return math.fmod(a, b)


def _and(left: Evaluate, right: Evaluate) -> Evaluate:
    def evaluate(row: Row) -> Any:
        a, b = left(row), right(row)
        if a is False or b is False:
            return False
        return None if a is None or b is None else True

    return evaluate


def _or(left: Evaluate, right: Evaluate) -> Evaluate:
    def evaluate(row: Row) -> Any:
        a, b = left(row), right(row)
        if a is True or b is True:
            return True
        return None if a is None or b is None else False

    return evaluate


def _in(value: Evaluate, options: list[Evaluate]) -> Evaluate:
    def evaluate(row: Row) -> Any:
        v = value(row)
        if v is None:
            return None
        seen = [option(row) for option in options]
        if v in [s for s in seen if s is not None]:
            return True
        return None if any(s is None for s in seen) else False

    return evaluate
