"""The acker's ListPending and GetTree(record_id) share one decoded view of the pending trees,
rebuilt at most once per interval: a flood of calls costs one decode, not one per call."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from onceflow.topology import Topic
from onceflow.v1 import acker_pb2

from onceflow_acker.admin import AckerAdminServicer
from onceflow_acker.stage import AckerStats
from onceflow_acker.trees import Tree

pytestmark = pytest.mark.security

class _CountingStore(dict):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.scans = 0

    def items(self):  # type: ignore[override]
        self.scans += 1
        return super().items()


class _Stores:
    def __init__(self, store: _CountingStore) -> None:
        self.store = store

    def items(self) -> list[tuple[int, _CountingStore]]:
        return [(0, self.store)]


class _Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"{code.name}: {details}")


def _tree(record_id: str, started_ms: int) -> bytes:
    return Tree(ack_val=1, started_ms=started_ms, deadline_ms=started_ms + 30_000, record_id=record_id).encode()


def test_a_flood_of_lookups_decodes_the_stores_once_per_interval() -> None:
    store = _CountingStore({i.to_bytes(8, "big"): _tree(f"r-{i}", started_ms=1_000 + i) for i in range(500)})
    now = [0.0]
    admin = AckerAdminServicer(_Stores(store), AckerStats(), Topic.INGEST_RECORDS, view_ttl_s=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    for i in range(200):
        listed = admin.ListPending(acker_pb2.ListPendingRequest(limit=10), _Context())  # type: ignore[arg-type]
        found = admin.GetTree(acker_pb2.GetTreeRequest(record_id=f"r-{i}"), _Context())  # type: ignore[arg-type]
        assert [t.origin.record_id for t in found.trees] == [f"r-{i}"]
    assert store.scans == 1
    assert listed.total_pending == 500
    assert [t.origin.record_id for t in listed.trees] == [f"r-{i}" for i in range(10)]  # oldest first
    now[0] = 1.5
    del store[(0).to_bytes(8, "big")]
    listed = admin.ListPending(acker_pb2.ListPendingRequest(limit=1), _Context())  # type: ignore[arg-type]
    assert store.scans == 2 and listed.total_pending == 499 and listed.trees[0].origin.record_id == "r-1"


def test_an_oversized_record_id_is_refused() -> None:
    admin = AckerAdminServicer(_Stores(_CountingStore()), AckerStats(), Topic.INGEST_RECORDS)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="INVALID_ARGUMENT: record_id: 300 bytes, the limit is 256"):
        admin.GetTree(acker_pb2.GetTreeRequest(record_id="x" * 300), _Context())  # type: ignore[arg-type]
