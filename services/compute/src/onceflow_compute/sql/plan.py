"""The query through Spark's own parser and analyser, read back as what onceflow runs.

Each declared table is an empty DataFrame of its schema, registered as a temp view; the query is
``spark.sql``'d against them and its analysed logical plan is walked through py4j. Three shapes
map today:

    Project [Filter] relation     -> a Transform (stateless; append-only)
    Aggregate [Filter] relation   -> an Aggregation (keyed by the GROUP BY; an updating table),
                                     with [Filter] above it for HAVING
    Project [Filter] Join(a, b)   -> a Join of two sides (joins.py)

A ``window(ts, ...)`` or ``session_window(ts, ...)`` in the GROUP BY is read from the parsed plan
(its arguments as written) and becomes the Aggregation's window: the node Spark's analyser adds
to compute it (a Project, or an Expand for hopping windows, with its IS NOT NULL filter) is not
the query's own and is left out of the shape.

Everything else is refused naming the construct. The row-level parts (the filter, the key,
the aggregates' arguments, the projection) are kept as the analyser's own SQL text of each
expression (``Expression.sql()``), which the job runs with ``selectExpr`` on each micro-batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from onceflow_compute.dataflow.windows import Hopping, Sessions, Tumbling, WindowFn
from onceflow_compute.sql.ddl import Table
from onceflow_compute.sql.having import compile_having
from onceflow_compute.sql.joins import JoinSpec, map_join
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
# Flink's window table functions: Spark's parser has no TABLE(...) in FROM; its window() is the form.
WINDOW_TVF = re.compile(r"\b(TUMBLE|HOP|SESSION|CUMULATE)\s*\(\s*TABLE\b", re.IGNORECASE)
WINDOW_FUNCTIONS = {"window", "session_window"}
WINDOW_COLUMNS = {"start": "window_start", "end": "window_end"}
# A multi-part (or empty) GROUP BY is one key column: the JSON array of the parts' string forms.
COMPOSITE_KEY = "__sql_key"
DURATION = re.compile(r"(\d+)\s*(millisecond|second|minute|hour|day|week)s?", re.IGNORECASE)
DURATION_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000, "week": 604_800_000}


@dataclass(frozen=True)
class AggregateSpec:
    name: str  # the result column
    function: str  # COUNT, COUNT_DISTINCT, SUM, MIN, MAX, AVG
    argument: str | None  # the analyser's SQL of the argument; None: COUNT(*)
    sql: str  # the aggregate as the analyser writes it


@dataclass(frozen=True)
class KeyPart:
    name: str  # the result column
    sql: str  # the analyser's SQL of the GROUP BY expression


@dataclass(frozen=True)
class WindowSpec:
    """A GROUP BY window as written: ``window(ts, size[, slide[, start]])`` or ``session_window(ts, gap)``."""

    function: str  # window or session_window
    column: str  # the event-time column
    size_ms: int = 0  # window: its length; session_window: the gap
    slide_ms: int = 0
    offset_ms: int = 0

    @property
    def window_fn(self) -> WindowFn:
        if self.function == "session_window":
            return Sessions(self.size_ms, merge_touching=True)  # as Spark's session_window
        if self.slide_ms and self.slide_ms != self.size_ms:
            return Hopping(self.size_ms, self.slide_ms, self.offset_ms)
        return Tumbling(self.size_ms, self.offset_ms)


@dataclass(frozen=True)
class Plan:
    table: Table
    alias: str  # the relation's name in the expressions' SQL (the table's or its alias)
    kind: str  # "transform", "aggregation" or "join"
    filter: str | None
    projections: tuple[tuple[str, str], ...] = ()  # transform: (name, SQL)
    keys: tuple[KeyPart, ...] = ()  # aggregation: the GROUP BY's expressions, the window's left out
    aggregates: tuple[AggregateSpec, ...] = ()
    window: WindowSpec | None = None
    warnings: tuple[str, ...] = field(default=())
    having: Callable[[dict[str, Any]], bool] | None = None  # the result rows kept
    having_sql: str | None = None
    join: JoinSpec | None = None

    @property
    def key(self) -> str:
        """The Aggregation's key column: the one GROUP BY expression's, else the composite."""
        return self.keys[0].name if len(self.keys) == 1 else COMPOSITE_KEY

    @property
    def key_sql(self) -> str:
        if len(self.keys) == 1:
            return self.keys[0].sql
        return "to_json(array(" + ", ".join(f"CAST({k.sql} AS STRING)" for k in self.keys) + "))"


def empty_frame(session: SparkSession, schema: pa.Schema) -> Any:
    """The declared table, empty: the frames the jobs see are made the same way (from Arrow), so
    the analyser sees the types the micro-batches will have."""
    return session.createDataFrame(schema.empty_table())


def table_view(session: SparkSession, table: Table) -> Any:
    """The table as the query sees it: its declared columns and its computed ones."""
    try:
        return table.with_computed(empty_frame(session, table.schema))
    except Exception as exc:  # noqa: BLE001 - Spark's ParseException and AnalysisException
        raise SqlError(f"table {table.name}: a computed column: {spark_error(exc)}") from None


def analyse(session: SparkSession, tables: dict[str, Table], query: str) -> Plan:
    """``query`` (padded to its place in the file, so Spark's positions are the file's) analysed
    against ``tables``; SqlError naming what is refused."""
    _refuse_window_tvfs(query)
    try:
        for table in tables.values():
            table_view(session, table).createOrReplaceTempView(table.name)
        window = _window_spec(_parsed(session, query))  # before the analyser, whose errors about a bad window are obscure
        try:
            # The JVM Dataset: pyspark has no public accessor for the analysed plan (classic Spark only).
            plan = getattr(session.sql(query), "_jdf").queryExecution().analyzed()
        except Exception as exc:  # noqa: BLE001 - Spark's ParseException and AnalysisException
            raise SqlError(spark_error(exc)) from None
        return _map(plan, tables, window)
    finally:
        for table in tables.values():
            session.catalog.dropTempView(table.name)


def _parsed(session: SparkSession, query: str) -> Any:
    """The parsed, unresolved plan (Spark's own parser, as spark.sql uses it)."""
    try:
        return getattr(session, "_jsparkSession").sessionState().sqlParser().parsePlan(query)
    except Exception as exc:  # noqa: BLE001 - Spark's ParseException
        raise SqlError(spark_error(exc)) from None


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


def _refuse_window_tvfs(query: str) -> None:
    match = WINDOW_TVF.search(blank(query))
    if match:
        line = query.count("\n", 0, match.start()) + 1
        column = match.start() - (query.rfind("\n", 0, match.start()) + 1) + 1
        raise SqlError(
            f"line {line}, column {column}: window table functions ({match.group(1).upper()}(TABLE ...)) are not "
            "supported: GROUP BY window(ts, '10 seconds'[, slide]) or session_window(ts, gap), and SELECT "
            "window.start AS window_start, window.end AS window_end"
        )


def _window_spec(parsed: Any) -> WindowSpec | None:
    """The one window()/session_window() call of the parsed query, with its arguments as written."""
    calls: dict[str, Any] = {}
    stack = list(_all_expressions(parsed))
    while stack:
        node = stack.pop()
        if node.nodeName() == "UnresolvedFunction" and node.nameParts().last().lower() in WINDOW_FUNCTIONS:
            calls[node.toString().replace("'", "")] = node
        stack.extend(_children(node))
    if not calls:
        return None
    if len(calls) > 1:
        raise SqlError(f"one window per query: this one has {len(calls)} ({', '.join(sorted(calls))})")
    call = next(iter(calls.values()))
    function = call.nameParts().last().lower()
    arguments = _seq(call.arguments())
    if call.isDistinct() or (function == "window" and not 2 <= len(arguments) <= 4) or (function == "session_window" and len(arguments) != 2):
        raise SqlError(f"{function}(...) takes (time column, {'size[, slide[, start]]' if function == 'window' else 'gap'})")
    column = arguments[0]
    if column.nodeName() != "UnresolvedAttribute":
        raise SqlError(f"{function}(...): the first argument is the table's event-time column (its WATERMARK column), "
                       f"not an expression ({column.toString().lstrip(chr(39))}): declare it as a computed column")
    durations = [_duration(function, a) for a in arguments[1:]]
    if function == "session_window":
        return WindowSpec(function, column.nameParts().last(), durations[0])
    size = durations[0]
    slide = durations[1] if len(durations) > 1 else size
    offset = durations[2] if len(durations) > 2 else 0
    if not 0 < slide <= size:
        raise SqlError(f"window(...): the slide ({slide} ms) must be more than 0 and at most the size ({size} ms)")
    return WindowSpec(function, column.nameParts().last(), size, slide, offset)


def _all_expressions(plan: Any) -> list[Any]:
    out, nodes = [], [plan]
    while nodes:
        node = nodes.pop()
        out.extend(_seq(node.expressions()))
        nodes.extend(_children(node))
    return out


def _duration(function: str, literal: Any) -> int:
    """A window duration in ms: '10 seconds', '1 minute 30 seconds' (no months: their length varies)."""
    text = literal.value().toString() if literal.nodeName() == "Literal" and literal.value() is not None else None
    if text is None:
        raise SqlError(f"{function}(...): durations are string literals such as '10 seconds'")
    rest, total = text.strip(), 0
    for match in DURATION.finditer(text):
        total += int(match.group(1)) * DURATION_MS[match.group(2).lower()]
        rest = rest.replace(match.group(0), "", 1)
    if rest.strip() or total <= 0:
        raise SqlError(f"{function}(...): duration {text!r}: whole milliseconds, seconds, minutes, hours, days or weeks")
    return total


def _children(node: Any) -> list[Any]:
    children = node.children()
    return [children.apply(i) for i in range(children.size())]


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _map(plan: Any, tables: dict[str, Table], window: WindowSpec | None) -> Plan:
    nodes, node = [], plan
    while node.nodeName() != "View":  # the plan's spine (joins and unions have two children: refused below)
        nodes.append(node)
        children = _children(node)
        if len(children) != 1:
            break
        node = children[0]
    if window is not None:
        nodes = _without_windowing(nodes, window)
    everything = _tree(plan)
    for each in everything:
        reason = None if window is not None and _makes_window(each) else REFUSED_NODES.get(each.nodeName())
        if reason:
            raise SqlError(reason)
    for each in everything:  # before the shape: Spark moves a non-deterministic key into a Project of its own
        for expression in _seq(each.expressions()):
            _check_replayable(expression)
    names = [n.nodeName() for n in nodes]
    if "Join" in names:
        return _join(nodes, tables, window)
    having = None
    if names[:2] == ["Filter", "Aggregate"]:  # HAVING over the aggregates the SELECT names
        having, nodes, names = nodes[0].condition(), nodes[1:], names[1:]
    if names.count("Aggregate") > 1 or ("Aggregate" in names and names[0] != "Aggregate"):
        above = names[: names.index("Aggregate")]
        if "Filter" in above:
            raise SqlError("HAVING reads an aggregate the SELECT does not name: SELECT it too (HAVING filters the result "
                           "table's rows, so what it reads must be a column of them)")
        raise SqlError("an expression over aggregates or a subquery is not yet supported: SELECT the aggregates themselves")
    top = nodes[0]
    rest = nodes[1:]
    condition = None
    if rest and rest[0].nodeName() == "Filter":
        condition = rest[0].condition()
        rest = rest[1:]
    aliases = [n.alias() for n in rest if n.nodeName() == "SubqueryAlias"]
    if not rest or not aliases or any(n.nodeName() != "SubqueryAlias" for n in rest):
        shape = " <- ".join(names)
        raise SqlError(f"only SELECT ... FROM one table [WHERE ...] [GROUP BY ...] is supported today; this query is {shape}")
    declared = {name.lower(): t for name, t in tables.items()}
    table = next((declared[a.lower()] for a in reversed(aliases) if a.lower() in declared), None)
    if table is None:
        raise SqlError(f"the query reads none of the declared tables ({', '.join(tables)})")
    where = None if condition is None else condition.sql()
    if window is not None:
        if top.nodeName() != "Aggregate":
            raise SqlError(f"{window.function}(...) belongs in a GROUP BY")
        if table.watermark_column is None or window.column.lower() != table.watermark_column.lower():
            event_time = f"its event-time column is {table.watermark_column}" if table.watermark_column else "it declares no WATERMARK"
            raise SqlError(f"{window.function}({window.column}, ...): a window is over the table's event-time column; "
                           f"table {table.name}: {event_time}")
    if top.nodeName() == "Project":
        return Plan(table, aliases[0], "transform", where, projections=_projections(top))
    if top.nodeName() == "Aggregate":
        return _aggregation(top, table, aliases[0], where, window, having)
    raise SqlError(f"{top.nodeName()} is not supported")


def _tree(plan: Any) -> list[Any]:
    """Every node of the query, down to the declared tables' views."""
    out, stack = [], [plan]
    while stack:
        node = stack.pop()
        if node.nodeName() == "View":
            continue
        out.append(node)
        stack.extend(_children(node))
    return out


def _join(nodes: list[Any], tables: dict[str, Table], window: WindowSpec | None) -> Plan:
    names = [n.nodeName() for n in nodes]
    if window is not None or "Aggregate" in names:
        raise SqlError("an aggregate or a window over a join is not yet supported: a join's result is the SELECT of its columns")
    if names not in (["Project", "Join"], ["Project", "Filter", "Join"]):
        raise SqlError(f"a join is SELECT columns FROM a JOIN b ON ... [WHERE ...]; this query is {' <- '.join(names)}")
    where = nodes[1].condition() if names[1] == "Filter" else None
    spec, named = map_join(nodes[0], where, nodes[-1], tables)
    for name, expression in named:
        _json_type(name, expression)
    _unique(list(spec.columns))
    if spec.left.table.stream != spec.right.table.stream:
        raise SqlError(f"both sides of a join read one stream; {spec.left.table.name} reads {spec.left.table.stream}, "
                       f"{spec.right.table.name} reads {spec.right.table.stream}")
    return Plan(spec.left.table, spec.left.alias, "join", None, join=spec)


def _without_windowing(nodes: list[Any], window: WindowSpec) -> list[Any]:
    """The spine without what the analyser added to compute the window: a Project or an Expand
    (hopping) whose output is named window or session_window, and the filters next to it that
    keep rows with a time (IS NOT NULL) or a time inside their window (overlapping hops)."""
    at = next((i for i, n in enumerate(nodes) if _makes_window(n)), None)
    if at is None:
        return nodes
    drop = {at} | {i for i in (at - 1, at + 1) if 0 <= i < len(nodes) and _windowing_filter(nodes[i], window)}
    return [n for i, n in enumerate(nodes) if i not in drop]


def _makes_window(node: Any) -> bool:
    """The node Spark's analyser adds to compute a window() (a Project; an Expand for hops)."""
    return node.nodeName() in ("Project", "Expand") and any(str(a.name()) in WINDOW_FUNCTIONS for a in _seq(node.output()))


def _windowing_filter(node: Any, window: WindowSpec) -> bool:
    if node.nodeName() != "Filter":
        return False
    condition = node.condition()
    if condition.nodeName() == "IsNotNull":
        child = condition.child()
        return bool(child.nodeName() == "AttributeReference" and child.name().lower() == window.column.lower())
    return any(str(r.name()) in WINDOW_FUNCTIONS for r in _seq(condition.references().toSeq()))


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


def _aggregation(node: Any, table: Table, alias: str, where: str | None, window: WindowSpec | None, having: Any) -> Plan:
    grouping = _seq(node.groupingExpressions())
    window_attribute = None
    if window is not None:
        window_attribute = next((g for g in grouping if g.nodeName() == "AttributeReference" and g.name() in WINDOW_FUNCTIONS), None)
        grouping = [g for g in grouping if g is not window_attribute]
    if not grouping and window is None:
        raise SqlError("an aggregate without GROUP BY is not yet supported: GROUP BY a key")
    keys: list[KeyPart | None] = [None] * len(grouping)
    aggregates, window_columns = [], {}
    for expression in _seq(node.aggregateExpressions()):
        name, inner = _output(expression)
        matched = next((i for i, g in enumerate(grouping) if inner.semanticEquals(g)), None)
        if matched is not None:
            if keys[matched] is not None:
                raise SqlError(f"the GROUP BY key {grouping[matched].sql()} is selected twice ({keys[matched].name}, {name})")  # type: ignore[union-attr]
            keys[matched] = KeyPart(name, inner.sql())  # any type: the row holds its string form
            continue
        if window_attribute is not None and _refers_to(inner, window_attribute):
            window_columns[_window_column(name, inner, window_attribute)] = name
            continue
        _json_type(name, inner)
        aggregates.append(_aggregate(name, inner))
    missing = [g.sql() for g, k in zip(grouping, keys, strict=True) if k is None]
    if missing:
        raise SqlError(f"SELECT the GROUP BY key ({', '.join(missing)}) so that each row names its group")
    if window is not None and set(window_columns) != set(WINDOW_COLUMNS.values()):
        field_name = "session_window" if window.function == "session_window" else "window"
        raise SqlError(f"a windowed query SELECTs {field_name}.start AS window_start, {field_name}.end AS window_end: "
                       "every windowed row carries its window (as epoch milliseconds)")
    if not aggregates:
        raise SqlError("a GROUP BY without aggregates (a DISTINCT) is not yet supported: add COUNT(*)")
    parts = tuple(k for k in keys if k is not None)
    time = [table.event_time_source or ""] if window is not None else []  # the time column rides along as epoch ms
    _unique([k.name for k in parts] + [a.name for a in aggregates] + list(window_columns.values()) + [COMPOSITE_KEY] + time)
    warnings = []
    references = {r.name().lower() for g in grouping for r in _seq(g.references().toSeq())}
    if table.watermark_column and table.watermark_column.lower() in references:
        listed = ", ".join(g.sql() for g in grouping)
        warnings.append(
            f"GROUP BY {listed} groups by the event time ({table.watermark_column}) without a window: "
            "a new group per distinct time, kept forever, so the state grows without bound. Bound it with a "
            f"windowed GROUP BY: GROUP BY window({table.watermark_column}, '1 minute')"
        )
    return Plan(table, alias, "aggregation", where, keys=parts, aggregates=tuple(aggregates), window=window, warnings=tuple(warnings),
                having=None if having is None else compile_having(having, {a.name for a in aggregates}),
                having_sql=None if having is None else having.sql())


def _refers_to(expression: Any, attribute: Any) -> bool:
    return any(r.semanticEquals(attribute) for r in _seq(expression.references().toSeq()))


def _window_column(name: str, expression: Any, window_attribute: Any) -> str:
    """``window.start AS window_start`` (or ``.end AS window_end``): the only uses of the window."""
    field_name = expression.extractFieldName() if expression.nodeName() == "GetStructField" else None
    if field_name is not None and expression.child().semanticEquals(window_attribute) and WINDOW_COLUMNS.get(field_name) == name:
        return name
    raise SqlError(f"{name} = {expression.sql()}: the window is selected as {window_attribute.name()}.start AS window_start "
                   f"and {window_attribute.name()}.end AS window_end, and in no other way")


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
