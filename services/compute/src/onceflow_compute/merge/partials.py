"""Partials: what the map hop's engine output says per key, and how a key's partials merge.

``merge_partials`` is the one loop that merges partials per key (and event-time bucket): the
map hop runs it over the parts a bisected batch ran in, batch mode over its whole input. The
merge hop then merges each key's partials into its state with the same ``Aggregation.merge``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pyarrow as pa

from onceflow.v1.compute_pb2 import PartialAggregate

from onceflow_compute.api import Aggregation, JSONValue
from onceflow_compute.engine import BUCKET, KEY, partial_columns

# (group key, event-time bucket: 0 unless windowed)
KeyBucket = tuple[str, int]


def partials_by_key(job: Aggregation, table: pa.Table) -> list[tuple[str, int, list[JSONValue]]]:
    """(key, event-time bucket (0 unless windowed), partials) per row of an engine's output."""
    keys = table.column(KEY).to_pylist()
    buckets = table.column(BUCKET).to_pylist() if job.windowed else [0] * len(keys)
    columns = [table.column(name).to_pylist() for name in partial_columns(job)]
    out = []
    for row, (key, bucket) in enumerate(zip(keys, buckets, strict=True)):
        partials, at = [], 0
        for aggregate in job.aggregates:
            partials.append(aggregate.partial([columns[at + j][row] for j in range(aggregate.width)]))
            at += aggregate.width
        out.append((key, bucket, partials))
    return out


def merge_partials(job: Aggregation, outputs: Iterable[pa.Table]) -> dict[KeyBucket, list[JSONValue]]:
    """Every engine output's partials, merged per key and bucket (in first-seen order)."""
    merged: dict[KeyBucket, list[JSONValue]] = {}
    for table in outputs:
        for key, bucket, partials in partials_by_key(job, table):
            at = (key, bucket)
            merged[at] = job.merge(merged[at], partials) if at in merged else partials
    return merged


def decode_partials(job: Aggregation, partial: PartialAggregate) -> list[JSONValue]:
    """A PartialAggregate's partials, one per aggregate; ValueError (poison) otherwise."""
    values = json.loads(partial.partials)
    if not isinstance(values, list) or len(values) != len(job.aggregates):
        raise ValueError(f"partials of {partial.key!r}: expected {len(job.aggregates)} values, got {values!r}")
    return values
