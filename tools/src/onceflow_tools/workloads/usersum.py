"""The keyed-count workload: records ``{"user": "u<k>", "amount": n}`` keyed by user, and the
answers of the ``usersum`` job over them (per user: total, count, smallest, largest) computed
without the pipeline. ``onceflow verify --workload keyed-count`` compares the sink's table with
them; ``onceflow bench`` runs every contender on these records."""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


from onceflow.admin.auth import ClientTokens
from onceflow_client import QueryClient
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_tools.workloads import ResultTable

JOB = "usersum"


@dataclass(frozen=True, slots=True)
class KeyedRecord:
    record_id: str
    user: str
    amount: int

    @property
    def payload(self) -> bytes:
        return json.dumps({"user": self.user, "amount": self.amount}).encode()


def records(count: int, users: int, id_prefix: str, seed: int = 1) -> Iterator[KeyedRecord]:
    rng = random.Random(seed)
    for index in range(count):
        yield KeyedRecord(f"{id_prefix}:{index}", f"u{rng.randrange(users)}", rng.randrange(1, 1000))


def ingest_records(keyed: Iterable[KeyedRecord]) -> list[IngestRecord]:
    return [IngestRecord(record_id=r.record_id.encode(), key=r.user.encode(), payload=r.payload) for r in keyed]


def fold_answer(keyed: Iterable[KeyedRecord]) -> ResultTable:
    """A plain Python fold."""
    rows: ResultTable = {}
    for r in keyed:
        row = rows.setdefault(r.user, {"user": r.user, "total": 0, "count": 0, "smallest": r.amount, "largest": r.amount})
        row["total"] += r.amount
        row["count"] += 1
        row["smallest"] = min(row["smallest"], r.amount)
        row["largest"] = max(row["largest"], r.amount)
    return rows


def batch_answer(keyed: Iterable[KeyedRecord]) -> ResultTable:
    """The job over the records as one bounded input (batch mode: one Spark job). Imports the
    compute package (and pyspark) only when called."""
    from onceflow_compute.batch import run_batch

    with tempfile.TemporaryDirectory(prefix="onceflow-batch-") as tmp:
        path = Path(tmp) / "records.jsonl"
        with path.open("wb") as out:
            for r in keyed:
                out.write(r.payload + b"\n")
        return run_batch(JOB, path).table


def sink_table(address: str, timeout_s: float = 10.0) -> ResultTable:
    """The job's whole result table as the sink serves it, page by page."""
    with QueryClient(address, ClientTokens().bearer(), timeout_s=timeout_s) as query:
        rows = query.table(JOB, prefix="u")
    return {key: json.loads(value) for key, value in rows.items()}
