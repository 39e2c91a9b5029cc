"""The main job's answers, computed without the pipeline: ``auctionbids`` (per auction: bids,
highest bid, volume) over a Nexmark stream. The demo and ``onceflow verify`` compare the table
the sink serves with them."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path


from onceflow.admin.auth import ClientTokens
from onceflow_client import QueryClient
from onceflow_tools.workloads import ResultTable, nexmark

JOB = "auctionbids"


def fold_answer(arrivals: Iterable[nexmark.Event]) -> ResultTable:
    """A plain Python fold of the bids."""
    rows: ResultTable = {}
    for e in arrivals:
        if e.kind != "bid":
            continue
        key, price = str(e.fields["auction"]), e.fields["price"]
        row = rows.setdefault(key, {"auction": key, "bids": 0, "highest": price, "volume": 0})
        row["bids"] += 1
        row["highest"] = max(row["highest"], price)
        row["volume"] += price
    return rows


def batch_answer(arrivals: Iterable[nexmark.Event]) -> ResultTable:
    """The job over the events as one bounded input (batch mode: one Spark job). Imports the
    compute package (and pyspark) only when called."""
    from onceflow_compute.batch import run_batch

    with tempfile.TemporaryDirectory(prefix="onceflow-batch-") as tmp:
        path = Path(tmp) / "events.jsonl"
        with path.open("wb") as out:
            for e in arrivals:
                out.write(e.payload() + b"\n")
        return run_batch(JOB, path).table


def sink_table(address: str, timeout_s: float = 10.0) -> ResultTable:
    """The job's whole result table as the sink serves it, page by page."""
    with QueryClient(address, ClientTokens().bearer(), timeout_s=timeout_s) as query:
        rows = query.table(JOB)
    return {key: json.loads(value) for key, value in rows.items()}
