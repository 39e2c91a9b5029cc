"""`CREATE TABLE` in Flink's form, parsed here (Spark SQL has no WATERMARK clause): a small,
strict parser whose errors give the line and column.

    CREATE TABLE orders (
      product STRING NOT NULL, quantity BIGINT, ts TIMESTAMP(3),
      WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
    ) WITH ('stream' = 'orders')

A computed column (``name AS expression``, Flink's form) is a Spark SQL expression over the
declared ones, computed on each micro-batch before the query: ``ts AS timestamp_millis(date_time)``
gives a payload of epoch milliseconds an event-time column to window and watermark on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from onceflow import streams

from onceflow_compute.api import METADATA_COLUMNS
from onceflow_compute.sql.text import SqlError, position

# SQL type -> Arrow type of the job's schema (the JSON reader parses payloads with it).
TYPES: dict[str, pa.DataType] = {
    "STRING": pa.string(), "VARCHAR": pa.string(), "CHAR": pa.string(),
    "BIGINT": pa.int64(), "INT": pa.int32(), "INTEGER": pa.int32(), "SMALLINT": pa.int16(), "TINYINT": pa.int8(),
    "BOOLEAN": pa.bool_(), "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "REAL": pa.float32(),
    # ISO 8601 text in the payload ("2026-11-28T12:00:00.250"); Arrow's JSON reader takes no numbers here.
    "TIMESTAMP": pa.timestamp("ms"),
}
# The one computed event time the map hop can read without Spark: epoch milliseconds of a column.
MILLIS_COLUMN = re.compile(r"timestamp_millis\(\s*(?:`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*))\s*\)", re.IGNORECASE)
INTEGER_TYPES = (pa.int64(), pa.int32(), pa.int16(), pa.int8())
UNITS_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
OPTIONS = {"stream"}


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # as declared, e.g. TIMESTAMP(3)
    arrow: pa.DataType
    nullable: bool


@dataclass(frozen=True)
class Computed:
    name: str
    sql: str  # a Spark SQL expression over the table's columns


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    stream: str = streams.DEFAULT
    watermark_column: str | None = None
    watermark_delay_ms: int = 0
    computed: tuple[Computed, ...] = ()

    @property
    def event_time_source(self) -> str | None:
        """The payload column the map hop reads event time (ms) from, before the query runs: the
        watermark's TIMESTAMP column, or the BIGINT column of ``ts AS timestamp_millis(c)``."""
        if self.watermark_column is None:
            return None
        computed = {c.name.lower(): c for c in self.computed}.get(self.watermark_column.lower())
        if computed is None:
            return self.watermark_column
        match = MILLIS_COLUMN.fullmatch(computed.sql)
        return match.group(1) or match.group(2) if match else None

    def with_computed(self, frame: Any) -> Any:
        """``frame`` (a Spark DataFrame of the declared columns) with the computed ones."""
        if not self.computed:
            return frame
        return frame.selectExpr("*", *[f"{c.sql} AS `{c.name}`" for c in self.computed])

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow, nullable=c.nullable) for c in self.columns])


TOKEN = re.compile(r"\s+|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|`(?P<quoted>[^`]+)`|'(?P<string>(?:[^']|'')*)'|(?P<number>\d+)|(?P<punct>[(),=\-;])|(?P<other>\S)")


class _Tokens:
    def __init__(self, source: str, start: int, text: str) -> None:
        self.source, self.items = source, []
        at = 0
        while at < len(text):
            match = TOKEN.match(text, at)
            if match is None:
                self.fail_at(start + at, f"unexpected {text[at]!r}")
            assert match is not None
            if match.lastgroup:
                kind = match.lastgroup
                value = match.group(kind)
                self.items.append((kind, value.replace("''", "'") if kind == "string" else value, start + at))
            at = match.end()
        self.items.append(("end", "", start + len(text)))
        self.i = 0

    def fail_at(self, offset: int, message: str) -> None:
        line, column = position(self.source, offset)
        raise SqlError(f"line {line}, column {column}: CREATE TABLE: {message}")

    def peek(self, word: str) -> bool:
        kind, value, _ = self.items[self.i]
        return (kind == "word" and value.upper() == word) or (kind == "punct" and value == word)

    def next_is(self, word: str) -> bool:
        """The token after the current one is ``word`` (``name AS ...``: a computed column)."""
        if self.i + 1 >= len(self.items):
            return False
        kind, value, _ = self.items[self.i + 1]
        return kind == "word" and value.upper() == word

    def take(self, word: str) -> None:
        if not self.peek(word):
            self.fail(f"expected {word}")
        self.i += 1

    def fail(self, message: str) -> None:
        kind, value, offset = self.items[self.i]
        self.fail_at(offset, f"{message}, found {value!r}" if kind != "end" else f"{message}, found the end")

    def name(self) -> str:
        kind, value, _ = self.items[self.i]
        if kind not in ("word", "quoted"):
            self.fail("expected a name")
        self.i += 1
        return value

    def of(self, kind: str) -> str:
        if self.items[self.i][0] != kind:
            self.fail(f"expected a {kind}")
        self.i += 1
        return self.items[self.i - 1][1]


def is_create_table(text: str) -> bool:
    return re.match(r"\s*CREATE\s+TABLE\b", text, re.IGNORECASE) is not None


def parse_table(source: str, start: int, text: str) -> Table:
    tokens = _Tokens(source, start, text)
    tokens.take("CREATE")
    tokens.take("TABLE")
    name = tokens.name()
    tokens.take("(")
    columns: list[Column] = []
    computed: list[Computed] = []
    watermark: tuple[str, int, int] | None = None  # column, delay, offset of the clause
    while True:
        if tokens.peek("WATERMARK"):
            if watermark is not None:
                tokens.fail("a second WATERMARK")
            watermark = _watermark(tokens)
        elif tokens.next_is("AS"):
            computed.append(_computed(tokens, text, start))
        else:
            columns.append(_column(tokens))
        if tokens.peek(","):
            tokens.take(",")
            continue
        tokens.take(")")
        break
    options = _options(tokens) if tokens.peek("WITH") else {}
    if tokens.items[tokens.i][0] != "end":
        tokens.fail("expected the end of CREATE TABLE")
    all_names = [c.name for c in columns] + [c.name for c in computed]
    names = [n.lower() for n in all_names]
    for i, column_name in enumerate(all_names):
        if column_name.lower() in names[:i]:
            tokens.fail_at(start, f"table {name}: column {column_name} is declared twice")
        if column_name in METADATA_COLUMNS.names:
            tokens.fail_at(start, f"table {name}: {column_name} is a reserved metadata column name")
    table = Table(name, tuple(columns), options.get("stream", streams.DEFAULT), computed=tuple(computed))
    if watermark is None:
        return table
    column_name, delay, offset = watermark
    declared = {c.name.lower(): c for c in columns}.get(column_name.lower())
    derived = {c.name.lower(): c for c in computed}.get(column_name.lower())
    if declared is None and derived is None:
        tokens.fail_at(offset, f"WATERMARK FOR {column_name}: table {name} has no column {column_name}")
    elif declared is not None and declared.arrow != pa.timestamp("ms"):
        tokens.fail_at(offset, f"WATERMARK FOR {column_name}: a watermark needs a TIMESTAMP column, {column_name} is {declared.sql_type}")
    if derived is not None:
        # The map hop decides lateness per record before the query runs, from the payload.
        match = MILLIS_COLUMN.fullmatch(derived.sql)
        millis_of = (match.group(1) or match.group(2)).lower() if match else ""
        millis_column = {c.name.lower(): c for c in columns}.get(millis_of)
        if millis_column is None or millis_column.arrow not in INTEGER_TYPES:
            tokens.fail_at(offset, f"WATERMARK FOR {column_name}: a computed event time is timestamp_millis(c) of an integer "
                                   f"column c of the table (epoch milliseconds), not {derived.sql}; or declare a TIMESTAMP column")
    event_time = declared.name if declared is not None else derived.name  # type: ignore[union-attr]
    return Table(name, tuple(columns), table.stream, event_time, delay, tuple(computed))


def _column(tokens: _Tokens) -> Column:
    name = tokens.name()
    kind, word, _ = tokens.items[tokens.i]
    if kind != "word" or word.upper() not in TYPES:
        tokens.fail(f"column {name}: expected a type ({', '.join(TYPES)})")
    tokens.i += 1
    declared = word.upper()
    if tokens.peek("("):  # VARCHAR(20), TIMESTAMP(3): the precision changes nothing here
        tokens.take("(")
        precision = tokens.of("number")
        tokens.take(")")
        if declared == "TIMESTAMP" and int(precision) > 3:
            tokens.fail(f"column {name}: TIMESTAMP({precision}): milliseconds at most (TIMESTAMP(3))")
        declared = f"{declared}({precision})"
    nullable = True
    if tokens.peek("NOT"):
        tokens.take("NOT")
        tokens.take("NULL")
        nullable = False
    return Column(name, declared, TYPES[word.upper()], nullable)


def _computed(tokens: _Tokens, text: str, start: int) -> Computed:
    """``name AS expression``: the expression's text up to the next comma or parenthesis that
    closes the column list (Spark parses it when the query is analysed)."""
    name = tokens.name()
    tokens.take("AS")
    first = tokens.i
    depth = 0
    while True:
        kind, value, _ = tokens.items[tokens.i]
        if kind == "end" or (depth == 0 and kind == "punct" and value in ",)"):
            break
        depth += {"(": 1, ")": -1}.get(value, 0) if kind == "punct" else 0
        tokens.i += 1
    if tokens.i == first:
        tokens.fail(f"computed column {name}: expected an expression")
    begin, end = tokens.items[first][2], tokens.items[tokens.i][2]
    return Computed(name, text[begin - start : end - start].strip())


def _watermark(tokens: _Tokens) -> tuple[str, int, int]:
    offset = tokens.items[tokens.i][2]
    tokens.take("WATERMARK")
    tokens.take("FOR")
    column = tokens.name()
    tokens.take("AS")
    if tokens.name() != column:
        tokens.fail(f"WATERMARK FOR {column} AS {column} - INTERVAL '...' unit: the expression must start from {column}")
    delay = 0
    if tokens.peek("-"):
        tokens.take("-")
        tokens.take("INTERVAL")
        amount = tokens.of("string").strip()
        if not amount.isdigit():
            tokens.fail("an INTERVAL of a whole number")
        unit = tokens.name().upper().removesuffix("S")
        if unit not in UNITS_MS:
            tokens.fail(f"an INTERVAL unit ({', '.join(UNITS_MS)})")
        delay = int(amount) * UNITS_MS[unit]
    return column, delay, offset


def _options(tokens: _Tokens) -> dict[str, str]:
    tokens.take("WITH")
    tokens.take("(")
    options: dict[str, str] = {}
    while True:
        key = tokens.of("string")
        if key not in OPTIONS:
            tokens.i -= 1
            tokens.fail(f"unknown option (known: {', '.join(sorted(OPTIONS))})")
        tokens.take("=")
        options[key] = tokens.of("string")
        if tokens.peek(","):
            tokens.take(",")
            continue
        tokens.take(")")
        try:
            streams.check_stream_name(options.get("stream", streams.DEFAULT))
        except ValueError as exc:
            tokens.i -= 2
            tokens.fail(str(exc))
        return options
