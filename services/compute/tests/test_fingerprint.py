"""The state fingerprint and the comparison a worker runs on start (pure: no broker)."""

from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.state.store import MemoryStore
from onceflow.v1.compute_pb2 import PartialAggregate

from onceflow_compute.api import Aggregation, Avg, Count, Max, Min, Sum
from onceflow_compute.api.aggregates import Aggregate
from onceflow_compute.dataflow.windows import Tumbling
from onceflow_compute.fingerprint import Decision, compare, describe, fingerprint, remap
from onceflow_compute.lifecycle import decide, fingerprint_key, parse, record
from onceflow_compute.merge.layout import StateLayout, remap_state
from onceflow_compute.results import state_key

pytestmark = pytest.mark.lifecycle

SCHEMA = pa.schema([pa.field("sensor", pa.string(), nullable=False), pa.field("value", pa.int64(), nullable=False)])
POOL: list[Aggregate] = [Count("n"), Sum("value", name="total"), Min("value", name="lo"), Max("value", name="hi"), Avg("value", name="avg")]


def job(aggregates: list[Aggregate], **changes: object) -> Aggregation:
    base = Aggregation(name="sensors", schema=SCHEMA, key="sensor", aggregates=tuple(aggregates))
    return replace(base, **changes) if changes else base  # type: ignore[arg-type]


subsets = st.lists(st.sampled_from(range(len(POOL))), min_size=1, unique=True)


@given(subsets, st.randoms())
def test_reordering_changes_only_positions_and_carries_over_by_name(chosen: list[int], rnd: object) -> None:
    before = [POOL[i] for i in chosen]
    after = list(before)
    rnd.shuffle(after)  # type: ignore[attr-defined]
    verdict = compare(describe(job(before)), describe(job(after)))
    if after == before:
        assert verdict.decision is Decision.IDENTICAL
        assert fingerprint(describe(job(before))) == fingerprint(describe(job(after)))
        return
    assert verdict.decision is Decision.CARRY_OVER
    assert fingerprint(describe(job(before))) != fingerprint(describe(job(after)))
    # The mapping puts every stored partial where the loaded job expects it, by name.
    stored = [a.name for a in before]
    assert remap(stored, verdict.mapping) == [a.name for a in after]
    assert all("position" in d for d in verdict.differences)


@given(subsets, st.sampled_from(range(len(POOL))))
def test_adding_or_removing_an_aggregate_is_refused_and_named(chosen: list[int], other: int) -> None:
    before = [POOL[i] for i in chosen]
    after = [POOL[i] for i in chosen if i != other] if other in chosen else [*before, POOL[other]]
    if not after:
        return
    verdict = compare(describe(job(before)), describe(job(after)))
    assert verdict.decision is Decision.REFUSED
    word = "removed" if other in chosen else "added"
    assert any(f"aggregate {POOL[other].name!r}" in d and word in d for d in verdict.differences), verdict.differences


@given(subsets, st.text(alphabet="abcdefghij_", min_size=1, max_size=8))
def test_renaming_an_aggregate_is_refused(chosen: list[int], name: str) -> None:
    before = [POOL[i] for i in chosen]
    if name in {a.name for a in before} or name == "sensor":
        return
    after = [replace(before[0], name=name), *before[1:]]  # type: ignore[type-var]
    verdict = compare(describe(job(before)), describe(job(after)))
    assert verdict.decision is Decision.REFUSED
    assert fingerprint(describe(job(before))) != fingerprint(describe(job(after)))


@given(st.text(max_size=40), st.text(max_size=40))
def test_the_doc_string_shapes_no_state(doc_a: str, doc_b: str) -> None:
    a, b = job(POOL[:2], doc=doc_a), job(POOL[:2], doc=doc_b)
    assert fingerprint(describe(a)) == fingerprint(describe(b))
    assert compare(describe(a), describe(b)).decision is Decision.IDENTICAL


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"key": "value"}, "key changed"),
        ({"window": Tumbling(60_000)}, "window changed"),
        ({"schema": pa.schema([pa.field("sensor", pa.string()), pa.field("value", pa.float64())])}, "schema changed"),
        ({"allowed_lateness_ms": 5}, "allowed_lateness_ms changed"),
    ],
)
def test_a_changed_key_schema_window_or_lateness_is_refused(changes: dict[str, object], named: str) -> None:
    verdict = compare(describe(job([Count("n")])), describe(job([Count("n")], **changes)))
    assert verdict.decision is Decision.REFUSED and any(named in d for d in verdict.differences), verdict.differences


def test_a_changed_column_or_type_under_the_same_name_is_refused() -> None:
    verdict = compare(describe(job([Sum("value", name="x")])), describe(job([Max("value", name="x")])))
    assert verdict.decision is Decision.REFUSED and "aggregate 'x' changed from Sum(value) to Max(value)" in verdict.differences


def test_an_unknown_format_is_refused() -> None:
    stored = {**describe(job([Count("n")])), "v": 99}
    assert compare(stored, describe(job([Count("n")]))).decision is Decision.REFUSED


def test_the_issue_scenario_names_every_difference() -> None:
    old = job([Count("n"), Sum("value", name="total"), Min("value", name="lo"), Max("value", name="hi")])
    new = job([Sum("value", name="total"), Count("n"), Avg("value", name="avg"), Max("value", name="hi"), Min("value", name="lo")])
    check = decide(new, {0: describe(old), 1: describe(old), 2: None}, {2: False})
    assert check.refused and check.verdict.differences == ("aggregate 'avg' (Avg(value)) added",)
    assert "onceflow job deploy" in check.reason() and "'sensors'" in check.reason()


def test_state_without_a_fingerprint_is_taken_as_the_loaded_job() -> None:
    check = decide(job([Count("n")]), {0: None, 1: None}, {0: True, 1: False})
    assert check.verdict.decision is Decision.IDENTICAL and check.unfingerprinted == (0,)


def test_a_carry_over_remaps_the_store_and_writes_it_in_the_first_batch() -> None:
    old = job([Count("n"), Sum("value", name="total")])
    new = job([Sum("value", name="total"), Count("n")])
    old_layout = StateLayout(old)
    store = MemoryStore()
    store.apply({state_key("sensors", "s1"): b"[3,30]", fingerprint_key("sensors"): _record(old_layout)}, checkpoint=5)
    layout = StateLayout(new)
    layout.on_assign([0], {0: store})
    assert json.loads(store.get(state_key("sensors", "s1")) or b"") == [30, 3]
    assert parse(store.get(fingerprint_key("sensors")) or b"")[0] == describe(new)
    # In-flight partials of the old layout are read in the new order; the new layout's as is.
    partial = PartialAggregate(key="s1", partials=b"[1,10]", layout=old_layout.fingerprint)
    assert layout.partials(partial) == [10, 1]
    assert layout.partials(PartialAggregate(key="s1", partials=b"[10,1]", layout=layout.fingerprint)) == [10, 1]
    with pytest.raises(ValueError, match="neither runs nor carried"):
        layout.partials(PartialAggregate(key="s1", partials=b"[10,1]", layout="v1:0000000000000000"))
    # A later owner of the rewritten partition still reads the old layout's partials.
    later = StateLayout(new)
    later.on_assign([0], {0: store})
    assert later.partials(partial) == [10, 1]


def test_a_refused_partition_fails_every_batch_whole() -> None:
    store = MemoryStore()
    store.apply({fingerprint_key("sensors"): _record(StateLayout(job([Count("n")])))}, checkpoint=1)
    layout = StateLayout(job([Count("n"), Sum("value", name="total")]))
    layout.on_assign([0], {0: store})
    with pytest.raises(RuntimeError, match="'total'.*added"):
        layout.begin(None)  # type: ignore[arg-type]


def test_windowed_panes_are_remapped_inside() -> None:
    new = job([Sum("value", name="total"), Count("n")], window=Tumbling(1000))
    panes = [[0, 1000, [3, 30], {"n": 3}, [], True, False, 0, 1], [1000, 2000, None, None, [], False, False, 0, 0]]
    remapped = json.loads(remap_state(new, json.dumps(panes).encode(), (1, 0)))
    assert remapped[0][2] == [30, 3] and remapped[1][2] is None and remapped[0][3] == {"n": 3}


def _record(layout: StateLayout) -> bytes:
    return record(layout.description, layout.carried)
