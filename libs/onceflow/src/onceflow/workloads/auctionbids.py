"""The main job's answers, computed without the pipeline: ``auctionbids`` (per auction: bids,
highest bid, volume) over a Nexmark stream. The demo and ``onceflow verify`` compare the table
the sink serves with them."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

import grpc

from onceflow.v1 import sink_pb2, sink_pb2_grpc
from onceflow.workloads import nexmark

JOB = "auctionbids"
_SCAN_LIMIT = 10_000


def fold_answer(arrivals: Iterable[nexmark.Event]) -> dict[str, dict]:
    """A plain Python fold of the bids."""
    rows: dict[str, dict] = {}
    for e in arrivals:
        if e.kind != "bid":
            continue
        key, price = str(e.fields["auction"]), e.fields["price"]
        row = rows.setdefault(key, {"auction": key, "bids": 0, "highest": price, "volume": 0})
        row["bids"] += 1
        row["highest"] = max(row["highest"], price)
        row["volume"] += price
    return rows


def batch_answer(arrivals: Iterable[nexmark.Event]) -> dict[str, dict]:
    """The job over the events as one bounded input (batch mode: one Spark job). Imports the
    compute package (and pyspark) only when called."""
    from onceflow_compute.batch import run_batch

    with tempfile.TemporaryDirectory(prefix="onceflow-batch-") as tmp:
        path = Path(tmp) / "events.jsonl"
        with path.open("wb") as out:
            for e in arrivals:
                out.write(e.payload() + b"\n")
        return run_batch(JOB, path).table


def sink_table(address: str, timeout_s: float = 10.0) -> dict[str, dict]:
    """The job's whole result table as the sink serves it (auction ids are digits: one scan per
    leading digit keeps each under the Query API's row limit)."""
    rows: dict[str, dict] = {}
    with grpc.insecure_channel(address) as channel:
        query = sink_pb2_grpc.QueryStub(channel)
        for digit in "0123456789":
            reply = query.Scan(sink_pb2.ScanRowsRequest(job=JOB, prefix=digit, limit=_SCAN_LIMIT), timeout=timeout_s)
            if len(reply.rows) == _SCAN_LIMIT:
                raise ValueError("too many auctions for one scan per digit: use fewer events")
            rows |= {row.key: json.loads(row.value) for row in reply.rows}
    return rows
