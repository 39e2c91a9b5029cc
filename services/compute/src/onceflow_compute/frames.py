"""Records -> one Arrow table per micro-batch, without a Python object per field.

Payloads are JSON objects. They are parsed together by Arrow's JSON reader against the job's
schema (one line each); only when that fails does the batch get bisected (bisection.py) to name
the bad records, so a clean batch costs one vectorised parse. The map hop's frames and batch
mode's input are parsed here alike.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.json as pj
from confluent_kafka import Message

from onceflow.acks import reader_edge
from onceflow.codec import decode_envelope
from onceflow.v1.envelope_pb2 import Envelope

from onceflow_compute.api import METADATA_COLUMNS
from onceflow_compute.bisection import bisect


@dataclass
class Frame:
    """The good records of a batch, row i of ``table`` = ``records[i]`` / ``envelopes[i]``."""

    table: pa.Table
    records: list[Message]
    envelopes: list[Envelope]
    # Every record that cannot enter the job: (record, its envelope if it had one, reason).
    rejected: list[tuple[Message, Envelope | None, str]] = field(default_factory=list)
    # Records re-driven to another job (Envelope.redrive_job): not this job's, not an error.
    passed_over: list[Envelope] = field(default_factory=list)
    # Records the job reads but whose trees it is no part of: they passed the gate before it
    # read the stream (Envelope.readers names other jobs). Processed, never acked.
    foreign: list[Envelope] = field(default_factory=list)


def parse_options(schema: pa.Schema) -> pj.ParseOptions:
    return pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")


def build_frame(records: list[Message], schema: pa.Schema, job: str = "", reader: str = "") -> Frame:
    """``job``: the reading job's name; a record re-driven to another job is passed over.
    ``reader``: the job as it runs (``job@n``); each envelope's edge becomes the one this reader
    acks (acks.reader_edge), and a record the gate named other readers for is ``foreign``."""
    options = parse_options(schema)
    passed_over: list[Envelope] = []
    foreign: list[Envelope] = []
    good: list[Message] = []
    envelopes: list[Envelope] = []
    lines: list[bytes] = []
    rejected: list[tuple[Message, Envelope | None, str]] = []
    for record in records:
        try:
            envelope = decode_envelope(record.value() or b"")
        except Exception as exc:  # noqa: BLE001 - undecodable bytes are poison, not a crash
            rejected.append((record, None, f"not an envelope: {exc}"))
            continue
        if envelope.redrive_job and envelope.redrive_job != job:
            passed_over.append(envelope)
            continue
        if reader and envelope.readers:  # no reader: a batch run over the topic, which acks nothing
            if reader in envelope.readers:
                envelope.edge_id = reader_edge(envelope.edge_id, reader)
            else:
                foreign.append(envelope)
        line = _one_line(envelope.payload)
        if not line:
            rejected.append((record, envelope, "empty payload: a JSON object is required"))
            continue
        good.append(record)
        envelopes.append(envelope)
        lines.append(line)

    keep, reasons = parse_checked(lines, options)
    for index, reason in reasons.items():
        rejected.append((good[index], envelopes[index], reason))
    if reasons:
        good = [r for i, r in enumerate(good) if i not in reasons]
        envelopes = [e for i, e in enumerate(envelopes) if i not in reasons]
        lines = [line for i, line in enumerate(lines) if i not in reasons]
        keep = _parse(lines, options) if lines else None
    table = keep if keep is not None else schema.empty_table()
    return Frame(_with_metadata(table, envelopes), good, envelopes, rejected, passed_over, foreign)


def _one_line(payload: bytes) -> bytes:
    # Outside strings a raw newline is only whitespace (inside them JSON requires \n), so
    # flattening keeps the meaning and lets the payloads be read as JSON lines.
    return payload.replace(b"\n", b" ").replace(b"\r", b" ").strip()


def _parse(lines: list[bytes], options: pj.ParseOptions) -> pa.Table:
    return pj.read_json(io.BytesIO(b"\n".join(lines)), parse_options=options)


MORE_THAN_ONE = "the payload holds more than one JSON value"


class MoreThanOneValue(ValueError):
    """A payload line that Arrow read as several JSON values."""


def parse_checked(lines: list[bytes], options: pj.ParseOptions) -> tuple[pa.Table | None, dict[int, str]]:
    """Parse all lines; on failure, bisect to find each line that fails alone (or holds more
    than one object). Returns the table of everything when nothing failed."""

    def attempt(start: int, stop: int) -> pa.Table:
        table = _parse(lines[start:stop], options)
        if table.num_rows != stop - start:
            raise MoreThanOneValue(MORE_THAN_ONE)
        return table

    def reason(exc: Exception) -> str:
        if isinstance(exc, MoreThanOneValue):
            return str(exc)
        if isinstance(exc, (pa.ArrowInvalid, pa.ArrowTypeError)):
            return _reason(exc)
        raise exc

    found = bisect(len(lines), attempt, reason)
    if found.failed:
        # Arrow names a row of its own parse and a JSON kind ("Invalid value. in row 0"); the
        # job's author needs the field, the type wanted and the value found.
        schema = options.explicit_schema
        return None, {
            i: why if why.startswith(MORE_THAN_ONE) else explain(lines[i], schema) or why for i, why in found.failed.items()
        }
    if not found.outputs:
        return None, found.failed
    # Parts that parse alone make the whole (a failure of the whole batch but no line's).
    return found.outputs[0] if len(found.outputs) == 1 else pa.concat_tables(found.outputs), {}


def explain(line: bytes, schema: pa.Schema | None) -> str | None:
    """Why one payload does not fit ``schema``, naming the field, the type it wants and what
    was there; None when no field can be blamed (Arrow's own reason then stands)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than Python parses
        return f"schema violation: not JSON: {exc}"
    if not isinstance(value, dict):
        return f"schema violation: not a JSON object but {_kind(value)} {_shown(value)}"
    for fld in schema or []:
        found = value.get(fld.name)
        if found is None:
            if not fld.nullable:
                said = "missing" if fld.name not in value else "null"
                return f"schema violation: a required field is missing: `{fld.name}` ({fld.type}) is {said}"
            continue
        if not _fits(fld.type, found):
            return f"schema violation: field `{fld.name}`: expected {fld.type}, got {_kind(found)} {_shown(found)}"
    return None


def _fits(wanted: pa.DataType, value: object) -> bool:
    """Whether a JSON value can be read as ``wanted`` (types this check does not know pass)."""
    if pa.types.is_integer(wanted):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_floating(wanted) or pa.types.is_decimal(wanted):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if pa.types.is_string(wanted) or pa.types.is_large_string(wanted):
        return isinstance(value, str)
    if pa.types.is_boolean(wanted):
        return isinstance(value, bool)
    if pa.types.is_timestamp(wanted) or pa.types.is_date(wanted):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    if pa.types.is_list(wanted) or pa.types.is_large_list(wanted):
        return isinstance(value, list)
    if pa.types.is_struct(wanted):
        return isinstance(value, dict)
    return True


def _kind(value: object) -> str:
    kinds = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"), (list, "an array"), (dict, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _shown(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _reason(exc: Exception) -> str:
    text = str(exc).replace("JSON parse error: ", "")
    if "required field was absent" in text:
        return "schema violation: a required field is missing"
    return f"schema violation: {text}"


def _with_metadata(table: pa.Table, envelopes: list[Envelope]) -> pa.Table:
    columns = {
        "_record_id": pa.array([e.record_id for e in envelopes], pa.string()),
        "_key": pa.array([e.key.decode("utf-8", "replace") for e in envelopes], pa.string()),
        "_event_time_ms": pa.array([e.event_time_ms for e in envelopes], pa.int64()),
        "_ingest_time_ms": pa.array([e.ingest_time_ms for e in envelopes], pa.int64()),
    }
    for meta in METADATA_COLUMNS:
        table = table.append_column(meta, columns[meta.name])
    return table
