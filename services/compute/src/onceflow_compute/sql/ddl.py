"""`CREATE TABLE` in Flink's form, parsed here (Spark SQL has no WATERMARK clause): a small,
strict parser whose errors give the line and column.

    CREATE TABLE orders (
      product STRING NOT NULL, quantity BIGINT, ts TIMESTAMP(3),
      WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
    ) WITH ('stream' = 'orders')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
UNITS_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
OPTIONS = {"stream"}


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # as declared, e.g. TIMESTAMP(3)
    arrow: pa.DataType
    nullable: bool


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    stream: str = streams.DEFAULT
    watermark_column: str | None = None
    watermark_delay_ms: int = 0

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow, nullable=c.nullable) for c in self.columns])


TOKEN = re.compile(r"\s+|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|`(?P<quoted>[^`]+)`|'(?P<string>(?:[^']|'')*)'|(?P<number>\d+)|(?P<punct>[(),=\-;])")


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
    watermark: tuple[str, int, int] | None = None  # column, delay, offset of the clause
    while True:
        if tokens.peek("WATERMARK"):
            if watermark is not None:
                tokens.fail("a second WATERMARK")
            watermark = _watermark(tokens)
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
    names = [c.name.lower() for c in columns]
    for i, column in enumerate(columns):
        if column.name.lower() in names[:i]:
            tokens.fail_at(start, f"table {name}: column {column.name} is declared twice")
        if column.name in METADATA_COLUMNS.names:
            tokens.fail_at(start, f"table {name}: {column.name} is a reserved metadata column name")
    table = Table(name, tuple(columns), options.get("stream", streams.DEFAULT))
    if watermark is None:
        return table
    column_name, delay, offset = watermark
    declared = {c.name.lower(): c for c in columns}.get(column_name.lower())
    if declared is None:
        tokens.fail_at(offset, f"WATERMARK FOR {column_name}: table {name} has no column {column_name}")
    elif declared.arrow != pa.timestamp("ms"):
        tokens.fail_at(offset, f"WATERMARK FOR {column_name}: a watermark needs a TIMESTAMP column, {column_name} is {declared.sql_type}")
    assert declared is not None
    return Table(name, tuple(columns), table.stream, declared.name, delay)


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
