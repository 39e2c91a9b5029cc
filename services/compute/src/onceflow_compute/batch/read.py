"""Batch mode's input: a JSON lines or Parquet file, read into the table a micro-batch's frame
would be (payload fields, then the metadata columns), with what was dropped on the way.

Input records carry the job's payload fields; the metadata columns (``_record_id``, ``_key``,
``_event_time_ms``, ``_ingest_time_ms``) may be given as fields of the record too. Absent ones
are null, except ``_record_id``, which defaults to the record's 1-based line (JSON lines) or
row (Parquet) number, as a string. Blank lines are skipped. Records that are malformed, break
the schema or miss a required (non-nullable) field are dropped and counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow_compute.api import METADATA_COLUMNS, Job
from onceflow_compute.bisection import bisect
from onceflow_compute.frames import parse_checked, parse_options

FORMATS = ("jsonl", "parquet")
PARQUET_SUFFIXES = (".parquet", ".pq")
# Lines parsed together: a clean chunk costs one vectorised parse; a dirty one is bisected.
CHUNK_LINES = 50_000
# Arrow's parse errors say where in the parsed chunk: meaningless once bisected to one line.
_IN_ROW = re.compile(r" in row \d+$")
CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


@dataclass
class BatchInput:
    """The records that enter the job (payload fields, then the metadata columns, exactly as
    a micro-batch's frame has them) and what was dropped on the way."""

    table: pa.Table
    # The 1-based line (JSON lines) or row (Parquet) number of each row of ``table``.
    numbers: list[int]
    rows_in: int
    # (line or row number, reason), for every dropped record.
    rejected: list[tuple[int, str]] = field(default_factory=list)


def resolve_format(path: str | Path, input_format: str | None = None) -> str:
    """``jsonl`` or ``parquet``: as given, else by the file's suffix (a directory is Parquet)."""
    if input_format:
        if input_format not in FORMATS:
            raise ValueError(f"format {input_format!r}: expected one of {', '.join(FORMATS)}")
        return input_format
    path = Path(path)
    return "parquet" if path.is_dir() or path.suffix.lower() in PARQUET_SUFFIXES else "jsonl"


def read_input(job: Job, path: str | Path, input_format: str | None = None) -> BatchInput:
    if resolve_format(path, input_format) == "parquet":
        return read_parquet(job, path)
    with open(path, "rb") as lines:
        return read_jsonl(job, lines)


def _input_schema(job: Job) -> pa.Schema:
    """The job's fields, then the metadata fields (nullable while reading)."""
    metadata = [f.with_nullable(True) for f in METADATA_COLUMNS if f.name not in job.schema.names]
    return pa.schema([*job.schema, *metadata])


def _frame_schema(job: Job) -> pa.Schema:
    """As a micro-batch's frame: the payload fields, then METADATA_COLUMNS."""
    return pa.schema([*job.schema, *(f for f in METADATA_COLUMNS if f.name not in job.schema.names)])


def read_jsonl(job: Job, source: Iterable[bytes]) -> BatchInput:
    """JSON lines, parsed as the map hop parses payloads (one Arrow parse per clean chunk)."""
    options = parse_options(_input_schema(job))
    tables: list[pa.Table] = []
    numbers: list[int] = []
    rejected: list[tuple[int, str]] = []
    rows_in = 0
    for chunk in _chunks(source, CHUNK_LINES):
        rows_in += len(chunk)
        lines = [line for _n, line in chunk]
        table, reasons = parse_checked(lines, options)
        if reasons:
            rejected.extend((chunk[i][0], _IN_ROW.sub("", reason)) for i, reason in sorted(reasons.items()))
            chunk = [entry for i, entry in enumerate(chunk) if i not in reasons]
            table, _ = parse_checked([line for _n, line in chunk], options)
        if table is not None:
            tables.append(table)
            numbers.extend(n for n, _line in chunk)
    return BatchInput(_to_frame(job, tables, numbers), numbers, rows_in, rejected)


def _chunks(source: Iterable[bytes], size: int) -> Iterator[list[tuple[int, bytes]]]:
    chunk: list[tuple[int, bytes]] = []
    for number, raw in enumerate(source, start=1):
        line = raw.strip()
        if not line:
            continue
        chunk.append((number, line))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def read_parquet(job: Job, path: str | Path) -> BatchInput:
    """A Parquet file (or directory): columns by name, cast to the schema's types; rows whose
    values do not cast, or that miss a required field, are dropped."""
    import pyarrow.parquet as pq

    source = pq.read_table(path)
    count = source.num_rows
    bad: dict[int, str] = {}
    columns: dict[str, pa.ChunkedArray] = {}
    for fld in _input_schema(job):
        if fld.name in source.column_names:
            column = source.column(fld.name)
        else:
            column = pa.chunked_array([pa.nulls(count, fld.type)], fld.type)
        for index, error in cast_failures(column, fld.type).items():
            bad.setdefault(index, f"schema violation: {fld.name}: {error}")
        columns[fld.name] = column
        if not fld.nullable:
            for index in pc.indices_nonzero(column.is_null()).to_pylist():
                bad.setdefault(index, "schema violation: a required field is missing")
    keep = pa.array([i for i in range(count) if i not in bad], pa.int64())
    schema = _input_schema(job)
    tables = [pa.table([columns[f.name].take(keep).cast(f.type) for f in schema], schema=schema)] if len(keep) else []
    rejected = [(index + 1, reason) for index, reason in sorted(bad.items())]
    numbers = [i + 1 for i in keep.to_pylist()]
    return BatchInput(_to_frame(job, tables, numbers), numbers, count, rejected)


def cast_failures(column: pa.ChunkedArray, target: pa.DataType) -> dict[int, str]:
    """The rows of ``column`` whose value does not cast to ``target`` alone (row -> Arrow's error)."""

    def attempt(start: int, stop: int) -> None:
        column.slice(start, stop - start).cast(target)

    def reason(exc: Exception) -> str:
        if isinstance(exc, CAST_ERRORS):
            return str(exc)
        raise exc

    return bisect(len(column), attempt, reason).failed


def _to_frame(job: Job, tables: list[pa.Table], numbers: list[int]) -> pa.Table:
    """The parsed records as a frame's table; a missing _record_id is the record's number."""
    schema = _frame_schema(job)
    if not tables:
        return schema.empty_table()
    read = pa.concat_tables([t.select(_input_schema(job).names) for t in tables])
    arrays: list[Any] = []
    for fld in schema:
        column = read.column(fld.name).combine_chunks()
        if fld.name == "_record_id" and column.null_count:
            column = pc.coalesce(column, pa.array([str(n) for n in numbers], pa.string()))
        arrays.append(column.cast(fld.type))
    return pa.Table.from_arrays(arrays, schema=schema)
