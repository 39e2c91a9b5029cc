"""What both hops write under one job's name: the key layout ``job \x00 key`` (of partials,
result changes and the merge hop's state; docs/key-layouts.md) and result changes."""

from __future__ import annotations

from onceflow.v1.acker_pb2 import Anchor
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute.api import JSONValue, encode_json


def state_key(job: str, key: str) -> bytes:
    return f"{job}\x00{key}".encode()


def result_change(
    job: str, key: str, op: ResultChange.Op, row: dict[str, JSONValue], anchor: Anchor | None = None, fingerprint: str = ""
) -> bytes:
    """``anchor``: the trees behind the change, which the sink acks once it is in Redis;
    ``fingerprint``: the job's state fingerprint, which the sink keeps in the table's meta."""
    return ResultChange(
        job=job, key=key, op=op, value=encode_json(row), anchor=anchor, fingerprint=fingerprint
    ).SerializeToString()
