"""What a job's rows are made of and carried as: JSON values, the metadata columns the worker
adds, and the one JSON encoding of rows and partials."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

JSONValue = Any

# A windowed job's rows carry their window.
WINDOW_START = "window_start"
WINDOW_END = "window_end"

# Columns the worker adds next to the payload fields, for prepare/transform to use.
METADATA_COLUMNS = pa.schema(
    [
        pa.field("_record_id", pa.string(), nullable=False),
        pa.field("_key", pa.string()),
        pa.field("_event_time_ms", pa.int64()),
        pa.field("_ingest_time_ms", pa.int64()),
    ]
)


def encode_json(value: JSONValue) -> bytes:
    """Compact and key-ordered, so equal rows are equal bytes (the sink compares bytes)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
