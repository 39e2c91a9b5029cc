"""The XOR tree table as pure functions: random trees, any message order."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow import acks
from onceflow.v1.acker_pb2 import AckerMessage, RecordRef
from onceflow_acker.trees import Outcome, SweepClock, Tree, apply, encode_new_init, expired, xor_pending

pytestmark = pytest.mark.acker

TIMEOUT = 30_000


def _tree_messages(rng: random.Random, fanouts: list[int], depth: int) -> list[AckerMessage]:
    """INIT for the spout's edges, then one ACK per edge (input ^ children), Storm style."""
    root = rng.getrandbits(64) or 1
    new_edge = lambda: rng.getrandbits(64) or 1  # noqa: E731
    spout_edges = [new_edge() for _ in range(max(1, fanouts[0] if fanouts else 1))]
    messages = [
        AckerMessage(
            kind=AckerMessage.INIT, root_id=root, xor_value=acks.xor_all(spout_edges), sent_at_ms=1000,
            origin=RecordRef(record_id="r", partition=1, offset=7), attempt=1, timeout_ms=TIMEOUT,
        )
    ]
    frontier, level, i = spout_edges, 0, 1
    while frontier:
        nxt = []
        for edge in frontier:
            children = [new_edge() for _ in range(fanouts[i % len(fanouts)] if level < depth and fanouts else 0)]
            i += 1
            messages.append(AckerMessage(kind=AckerMessage.ACK, root_id=root, xor_value=edge ^ acks.xor_all(children)))
            nxt.extend(children)
        frontier, level = nxt, level + 1
    return messages


def _run(messages: list[AckerMessage], now: int = 2000) -> tuple[list[int], Tree | None]:
    """Apply in order; return the indexes at which a decision came, and the final tree."""
    tree, decided_at = None, []
    for index, message in enumerate(messages):
        tree, decision = apply(tree, message, now, TIMEOUT)
        if decision is not None:
            decided_at.append(index)
            assert decision.outcome is Outcome.COMPLETED
            tree = None
    return decided_at, tree


trees = st.tuples(
    st.integers(min_value=0, max_value=2**32),  # id seed
    st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=6),  # fan-outs
    st.integers(min_value=0, max_value=3),  # depth
    st.randoms(use_true_random=False),  # delivery order
)


@settings(max_examples=300)
@given(trees)
def test_a_tree_completes_exactly_when_its_last_message_arrives(case):
    seed, fanouts, depth, order = case
    messages = _tree_messages(random.Random(seed), fanouts, depth)
    order.shuffle(messages)  # ACK before INIT included
    decided_at, tree = _run(messages)
    assert decided_at == [len(messages) - 1]
    assert tree is None


@settings(max_examples=200)
@given(trees, st.data())
def test_a_missing_or_duplicated_ack_never_completes(case, data):
    seed, fanouts, depth, order = case
    messages = _tree_messages(random.Random(seed), fanouts, depth)
    acks_only = [i for i, m in enumerate(messages) if m.kind == AckerMessage.ACK]
    victim = data.draw(st.sampled_from(acks_only))
    if data.draw(st.booleans()):
        broken = messages[:victim] + messages[victim + 1 :]
    else:
        broken = messages + [messages[victim]]
    order.shuffle(broken)
    decided_at, tree = _run(broken)
    # A duplicate may complete early only if it lands before the real last message; it must
    # then leave a non-zero remainder, never a second completion.
    if len(broken) < len(messages):
        assert decided_at == []
        assert tree is not None and tree.ack_val != 0
    else:
        assert len(decided_at) <= 1


@given(trees, st.data())
def test_fail_decides_failed_once_init_is_seen(case, data):
    seed, fanouts, depth, order = case
    messages = _tree_messages(random.Random(seed), fanouts, depth)
    at = data.draw(st.integers(min_value=0, max_value=len(messages)))
    messages.insert(at, AckerMessage(kind=AckerMessage.FAIL, root_id=messages[0].root_id, reason="boom"))
    order.shuffle(messages)
    fail_index = next(i for i, m in enumerate(messages) if m.kind == AckerMessage.FAIL)
    tree, outcomes = None, []
    for message in messages:
        tree, decision = apply(tree, message, 2000, TIMEOUT)
        if decision is not None:
            outcomes.append(decision.outcome)
            break
    # COMPLETED only if every ACK and the INIT arrived before the FAIL; otherwise FAILED.
    expected = Outcome.COMPLETED if fail_index == len(messages) - 1 else Outcome.FAILED
    assert outcomes == [expected]


def test_timeout_by_processing_time_and_encoding_round_trip():
    messages = _tree_messages(random.Random(1), [2], 1)
    tree, decision = apply(None, messages[0], 2000, TIMEOUT)
    assert decision is None and tree is not None
    assert Tree.decode(tree.encode()) == tree
    assert expired(tree, 1000 + TIMEOUT - 1) is None
    timed_out = expired(tree, 1000 + TIMEOUT)
    assert timed_out is not None and timed_out.outcome is Outcome.TIMED_OUT


def test_next_root_id_is_deterministic_and_distinct():
    assert acks.next_root_id(42, 2) == acks.next_root_id(42, 2)
    assert len({acks.next_root_id(42, a) for a in range(1, 100)}) == 99


@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.booleans(),
    st.booleans(),
    st.text(max_size=20),
)
def test_the_xor_fast_path_agrees_with_the_full_path(ack_val, xor_value, init_seen, failed, record_id):
    tree = Tree(ack_val, 1, 2, 3, 1, 0, init_seen, failed, record_id)
    fast = xor_pending(tree.encode(), xor_value)
    full, decision = apply(Tree.decode(tree.encode()), AckerMessage(kind=AckerMessage.ACK, root_id=9, xor_value=xor_value), 5, TIMEOUT)
    if fast is None:
        assert decision is not None  # only a possibly deciding ACK leaves the fast path
    elif decision is None:
        assert Tree.decode(fast) == full
    else:
        # A failed tree with INIT is decided on any message; the fast path must not hide that.
        assert failed and init_seen


@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=120_000),
    st.integers(min_value=1, max_value=5),
    st.text(max_size=30),
)
def test_the_new_init_fast_path_agrees_with_the_full_path(xor_value, sent_at, timeout, attempt, record_id):
    message = acks.init(9, [], RecordRef(record_id=record_id, partition=3, offset=77), attempt, timeout)
    message.xor_value, message.sent_at_ms = xor_value, sent_at
    fast = encode_new_init(message, 1_000, TIMEOUT)
    full, decision = apply(None, message, 1_000, TIMEOUT)
    if fast is None:
        assert xor_value == 0 and decision is not None and decision.outcome is Outcome.COMPLETED
    else:
        assert decision is None and Tree.decode(fast) == full


def test_the_sweep_clock_is_the_wall_clock_only_once_the_input_is_read_to_the_end() -> None:
    clock = SweepClock()
    assert clock.now(0, wall_ms=50_000, caught_up=True) == 50_000
    # Behind with nothing read yet: no tree of that partition can be judged late.
    assert clock.now(0, wall_ms=50_000, caught_up=False) == 0
    clock.observe(0, 20_000)
    clock.observe(0, 10_000)  # an older message read later does not move it back
    assert clock.now(0, wall_ms=50_000, caught_up=False) == 20_000
    assert clock.now(1, wall_ms=50_000, caught_up=False) == 0  # each partition on its own
    clock.forget([0])
    assert clock.now(0, wall_ms=50_000, caught_up=False) == 0
    clock.observe(0, 60_000)  # a sender's clock ahead of ours: never beyond the wall clock
    assert clock.now(0, wall_ms=50_000, caught_up=False) == 50_000


@pytest.mark.edges
def test_a_trees_deadline_counts_on_the_brokers_clock_not_the_ingest_hosts() -> None:
    """An INIT from an ingest host two hours slow (or fast) would time its tree out at once (or
    two hours late); stamped by the broker, the tree gets its timeout from its append time."""
    now, hour = 10 * 3_600_000, 3_600_000
    for skew in (-2 * hour, 2 * hour):
        init = acks.init(7, [11], RecordRef(record_id="r", partition=0, offset=3), 1, 5_000)
        init.sent_at_ms = now + skew
        tree, decision = apply(None, init, now, 30_000, appended_ms=now)
        assert decision is None and tree is not None and tree.deadline_ms == now + 5_000
        assert Tree.decode(encode_new_init(init, now, 30_000, appended_ms=now) or b"").deadline_ms == now + 5_000
