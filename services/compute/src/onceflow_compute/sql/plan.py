"""The query through Spark's own parser and analyser, read back as what onceflow runs.

Each declared table is an empty DataFrame of its schema, registered as a temp view; the query is
``spark.sql``'d against them and its analysed logical plan is walked through py4j. Only two
shapes map today, each over one table:

    Project [Filter] relation     -> a Transform (stateless; append-only)
    Aggregate [Filter] relation   -> an Aggregation (one key; an updating table)

Everything else is refused naming the construct. The row-level parts (the filter, the key,
the aggregates' arguments, the projection) are kept as the analyser's own SQL text of each
expression (``Expression.sql()``), which the job runs with ``selectExpr`` on each micro-batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from onceflow_compute.sql.ddl import Table
from onceflow_compute.sql.text import SqlError, blank

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Nodes that are refused, with why (the rest not listed under SHAPES: "not supported").
REFUSED_NODES = {
    "Sort": "ORDER BY is refused on a stream: the result is a table that keeps changing, not a sequence; order it when you read it",
    "GlobalLimit": "LIMIT is refused on a stream: which rows are first changes as records arrive",
    "LocalLimit": "LIMIT is refused on a stream: which rows are first changes as records arrive",
    "Offset": "OFFSET is refused on a stream",
    "Tail": "a tail of the rows is refused on a stream",
    "Join": "joins are not yet supported in SQL (issue 41); the Python API's Join runs stream-stream joins today",
    "Window": "window functions (OVER ...) are not supported",
    "Distinct": "SELECT DISTINCT is not yet supported; GROUP BY the columns with an aggregate instead",
    "Deduplicate": "SELECT DISTINCT is not yet supported; GROUP BY the columns with an aggregate instead",
    "Union": "UNION is not yet supported",
    "Intersect": "INTERSECT is not supported",
    "Except": "EXCEPT is not supported",
    "Expand": "GROUPING SETS, ROLLUP and CUBE are not yet supported",
    "Generate": "a generator (explode, LATERAL VIEW) is not yet supported",
    "WithCTE": "WITH (a common table expression) is not yet supported",
}
# Functions that read the clock: deterministic within one Spark query, but each micro-batch is a
# query of its own and a replay runs later, so the table would depend on when batches ran.
CLOCK_FUNCTIONS = {"current_timestamp", "now", "current_date", "curdate", "localtimestamp", "current_time", "unix_timestamp"}
AGGREGATES = {"Count": "COUNT", "Sum": "SUM", "Min": "MIN", "Max": "MAX", "Average": "AVG"}
# Result columns must be JSON values (docs/jobs.md#result-rows-are-json).
JSON_TYPES = {"string", "boolean", "tinyint", "smallint", "int", "bigint", "float", "double"}
WINDOW_CALL = re.compile(r"\b(TUMBLE|HOP|SESSION|CUMULATE|window|session_window|window_time)\s*\(", re.IGNORECASE)


@dataclass(frozen=True)
class AggregateSpec:
    name: str  # the result column
    function: str  # COUNT, COUNT_DISTINCT, SUM, MIN, MAX, AVG
    argument: str | None  # the analyser's SQL of the argument; None: COUNT(*)
    sql: str  # the aggregate as the analyser writes it


@dataclass(frozen=True)
class Plan:
    table: Table
    alias: str  # the relation's name in the expressions' SQL (the table's or its alias)
    kind: str  # "transform" or "aggregation"
    filter: str | None
    projections: tuple[tuple[str, str], ...] = ()  # transform: (name, SQL)
    key: str = ""  # aggregation: the key's result column
    key_sql: str = ""
    aggregates: tuple[AggregateSpec, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def empty_frame(session: SparkSession, schema: pa.Schema) -> Any:
    """The declared table, empty: the frames the jobs see are made the same way (from Arrow), so
    the analyser sees the types the micro-batches will have."""
    return session.createDataFrame(schema.empty_table())


def analyse(session: SparkSession, tables: dict[str, Table], query: str) -> Plan:
    """``query`` (padded to its place in the file, so Spark's positions are the file's) analysed
    against ``tables``; SqlError naming what is refused."""
    _refuse_windows(query)
    for table in tables.values():
        empty_frame(session, table.schema).createOrReplaceTempView(table.name)
    try:
        try:
            # The JVM Dataset: pyspark has no public accessor for the analysed plan (classic Spark only).
            plan = getattr(session.sql(query), "_jdf").queryExecution().analyzed()
        except Exception as exc:  # noqa: BLE001 - Spark's ParseException and AnalysisException
            raise SqlError(spark_error(exc)) from None
        return _map(plan, tables)
    finally:
        for table in tables.values():
            session.catalog.dropTempView(table.name)


def spark_error(exc: BaseException) -> str:
    """Spark's message, first line, its position as the file's line and column."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    where = re.search(r"\(line (\d+), pos (\d+)\)|line (\d+) pos (\d+)", text)
    first = re.sub(r"\s*SQLSTATE: \w+.*$", "", first)
    first = re.sub(r"^\[[A-Z_.]+\]\s*", "", first)
    kind = "syntax error" if type(exc).__name__ == "ParseException" else "query"
    if where is None:
        return f"{kind}: {first}"
    line, pos = (where.group(1), where.group(2)) if where.group(1) else (where.group(3), where.group(4))
    return f"line {line}, column {int(pos) + 1}: {kind}: {first}"


def _refuse_windows(query: str) -> None:
    match = WINDOW_CALL.search(blank(query))
    if match:
        line = query.count("\n", 0, match.start()) + 1
        column = match.start() - (query.rfind("\n", 0, match.start()) + 1) + 1
        raise SqlError(
            f"line {line}, column {column}: windows ({match.group(1).upper()}) are not yet supported in SQL (issue 41); "
            "the Python API's window= (Tumbling, Hopping, Sessions) runs them today"
        )


def _children(node: Any) -> list[Any]:
    children = node.children()
    return [children.apply(i) for i in range(children.size())]


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _map(plan: Any, tables: dict[str, Table]) -> Plan:
    nodes, node = [], plan
    while True:  # the plan's spine (joins and unions have two children: refused below)
        nodes.append(node)
        children = _children(node)
        if len(children) != 1:
            break
        node = children[0]
    for each in nodes:
        reason = REFUSED_NODES.get(each.nodeName())
        if reason:
            raise SqlError(reason)
    for each in nodes:  # before the shape: Spark moves a non-deterministic key into a Project of its own
        for expression in _seq(each.expressions()):
            _check_replayable(expression)
    names = [n.nodeName() for n in nodes]
    if names.count("Aggregate") > 1 or ("Aggregate" in names and names[0] != "Aggregate"):
        above = names[: names.index("Aggregate")]
        if "Filter" in above:
            raise SqlError("HAVING is not yet supported in SQL (issue 41): filter the result table when you read it")
        raise SqlError("an expression over aggregates or a subquery is not yet supported: SELECT the aggregates themselves")
    top = nodes[0]
    rest = nodes[1:]
    condition = None
    if rest and rest[0].nodeName() == "Filter":
        condition = rest[0].condition()
        rest = rest[1:]
    aliases = [n.alias() for n in rest if n.nodeName() == "SubqueryAlias"]
    if not rest or not aliases or any(n.nodeName() not in ("SubqueryAlias", "View") for n in rest[:-1]):
        shape = " <- ".join(names)
        raise SqlError(f"only SELECT ... FROM one table [WHERE ...] [GROUP BY one key] is supported today; this query is {shape}")
    declared = {name.lower(): t for name, t in tables.items()}
    table = next((declared[a.lower()] for a in reversed(aliases) if a.lower() in declared), None)
    if table is None:
        raise SqlError(f"the query reads none of the declared tables ({', '.join(tables)})")
    where = None if condition is None else condition.sql()
    if top.nodeName() == "Project":
        return Plan(table, aliases[0], "transform", where, projections=_projections(top))
    if top.nodeName() == "Aggregate":
        return _aggregation(top, table, aliases[0], where)
    raise SqlError(f"{top.nodeName()} is not supported")


def _check_replayable(expression: Any) -> None:
    """Refuses what would make the table depend on when or how often a batch runs."""
    stack = [expression]
    while stack:
        node = stack.pop()
        name = node.prettyName().lower() if hasattr(node, "prettyName") else ""
        if name in CLOCK_FUNCTIONS:
            raise SqlError(f"{name}() reads the clock: a replayed or late batch would give another answer; use the table's own time column")
        children = _children(node)
        if not node.deterministic() and all(child.deterministic() for child in children):
            raise SqlError(f"{node.sql()} is not deterministic: a replay after a crash would give another answer")
        if node.nodeName() in ("ScalarSubquery", "Exists", "ListQuery", "InSubquery", "LateralSubquery"):
            raise SqlError("subqueries are not supported")
        stack.extend(children)


def _output(expression: Any) -> tuple[str, Any]:
    """(result column, the expression under its alias)."""
    if expression.nodeName() == "Alias":
        return expression.name(), expression.child()
    return expression.name(), expression


def _json_type(name: str, expression: Any) -> None:
    kind = expression.dataType().simpleString()
    if kind not in JSON_TYPES:
        raise SqlError(
            f"result column {name} is {kind.upper()}: a result row holds JSON values; "
            f"cast it (CAST(... AS STRING), unix_millis(...))"
        )


def _unique(names: list[str]) -> None:
    seen = set()
    for name in names:
        if name.lower() in seen:
            raise SqlError(f"two result columns are named {name}: give one another name with AS")
        seen.add(name.lower())


def _projections(project: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for expression in _seq(project.projectList()):
        name, inner = _output(expression)
        _json_type(name, inner)
        out.append((name, inner.sql()))
    _unique([n for n, _ in out] + ["_record_id"])
    return tuple(out)


def _aggregation(node: Any, table: Table, alias: str, where: str | None) -> Plan:
    grouping = _seq(node.groupingExpressions())
    if not grouping:
        raise SqlError("an aggregate without GROUP BY is not yet supported: GROUP BY a key")
    if len(grouping) > 1:
        listed = ", ".join(g.sql() for g in grouping)
        raise SqlError(
            f"GROUP BY of {len(grouping)} expressions ({listed}) is not yet supported: "
            "group by one key, e.g. concat_ws('|', a, b) AS k"
        )
    key_expression = grouping[0]
    key, aggregates = "", []
    for expression in _seq(node.aggregateExpressions()):
        name, inner = _output(expression)
        if inner.semanticEquals(key_expression):
            if key:
                raise SqlError(f"the GROUP BY key is selected twice ({key}, {name})")
            key = name
            continue
        _json_type(name, inner)
        aggregates.append(_aggregate(name, inner))
    if not key:
        raise SqlError(f"SELECT the GROUP BY key ({key_expression.sql()}) so that each row names its group")
    if not aggregates:
        raise SqlError("a GROUP BY without aggregates (a DISTINCT) is not yet supported: add COUNT(*)")
    _unique([key] + [a.name for a in aggregates])
    warnings = []
    references = {r.name().lower() for r in _seq(key_expression.references().toSeq())}
    if table.watermark_column and table.watermark_column.lower() in references:
        warnings.append(
            f"GROUP BY {key_expression.sql()} groups by the event time ({table.watermark_column}) without a window: "
            "a new group per distinct time, kept forever, so the state grows without bound. Bound it with a "
            "windowed GROUP BY (TUMBLE: not yet in SQL; the Python API's window= with allowed lateness today)"
        )
    return Plan(table, alias, "aggregation", where, key=key, key_sql=key_expression.sql(), aggregates=tuple(aggregates),
                warnings=tuple(warnings))


def _aggregate(name: str, expression: Any) -> AggregateSpec:
    if expression.nodeName() != "AggregateExpression":
        raise SqlError(
            f"{name} = {expression.sql()}: an expression over aggregates is not yet supported; "
            "SELECT COUNT, SUM, MIN, MAX or AVG of a row expression"
        )
    function = expression.aggregateFunction()
    kind = AGGREGATES.get(function.nodeName())
    if kind is None:
        raise SqlError(f"{expression.sql()}: {function.prettyName()} is not supported (COUNT, SUM, MIN, MAX, AVG are)")
    if expression.filter().isDefined():
        raise SqlError(f"{expression.sql()}: FILTER (WHERE ...) on an aggregate is not yet supported")
    arguments = _children(function)
    if kind == "AVG" or kind == "SUM":
        arguments = arguments[:1]  # their other children are evaluation settings, not arguments
    if len(arguments) != 1:
        raise SqlError(f"{expression.sql()}: one argument is supported")
    argument = arguments[0]
    if expression.isDistinct():
        if kind != "COUNT":
            raise SqlError(f"{expression.sql()}: DISTINCT is supported in COUNT(DISTINCT ...) only")
        return AggregateSpec(name, "COUNT_DISTINCT", argument.sql(), expression.sql())
    if kind == "COUNT" and argument.foldable() and argument.nodeName() == "Literal" and argument.value() is not None:
        return AggregateSpec(name, "COUNT", None, expression.sql())
    return AggregateSpec(name, kind, argument.sql(), expression.sql())
