"""The state overlay: reads through, rolls back per record, reaches the store only on apply."""

from hypothesis import given
from hypothesis import strategies as st

from onceflow.state import MemoryStore, StateTransaction
import pytest

pytestmark = pytest.mark.foundation

keys = st.binary(min_size=1, max_size=3)
values = st.one_of(st.none(), st.binary(max_size=3))
writes = st.lists(st.tuples(keys, values), max_size=30)


def _write(txn: StateTransaction, key: bytes, value: bytes | None) -> None:
    if value is None:
        txn.delete(key)
    else:
        txn.put(key, value)


@given(base=writes, first=writes, second=writes)
def test_rollback_restores_exactly_the_savepoint_view(base, first, second):
    store = MemoryStore()
    store.apply(dict(base), checkpoint=None)
    txn = StateTransaction(store)
    for key, value in first:
        _write(txn, key, value)
    view = {k: txn.get(k) for k, _ in base + first + second}
    savepoint = txn.savepoint()
    for key, value in second:
        _write(txn, key, value)
    txn.rollback_to(savepoint)
    assert {k: txn.get(k) for k in view} == view


@given(base=writes, changes=writes)
def test_store_is_untouched_until_apply(base, changes):
    store = MemoryStore()
    store.apply(dict(base), checkpoint=5)
    before = dict(store.items())
    txn = StateTransaction(store)
    for key, value in changes:
        _write(txn, key, value)
    assert dict(store.items()) == before
    store.apply(txn.changes, checkpoint=9)
    expected = dict(before)
    for key, value in changes:
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    assert dict(store.items()) == expected
    assert store.checkpoint == 9


def test_checkpoint_never_moves_back():
    store = MemoryStore()
    store.apply({}, checkpoint=10)
    store.apply({}, checkpoint=3)
    store.apply({}, checkpoint=None)
    assert store.checkpoint == 10
