"""Pure parts of one ack edge per reader (docs/decisions/0028): the entries of stream.readers and
the edge algebra that lets a tree wait for every job reading its stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onceflow.acks import reader_edge, xor_all
from onceflow.readers import Reader, by_stream, reader_key

EDGES = st.integers(min_value=1, max_value=(1 << 64) - 1)
NAMES = st.text(alphabet="abcdefghij@0123456789_-", min_size=1, max_size=12)


def test_an_entry_round_trips_and_keys_by_stream_job_and_instance() -> None:
    entry = Reader("orders", "usersum@2", "0", 1_700_000_000_000)
    assert Reader.decode(entry.encode()) == entry
    assert entry.key == reader_key("orders", "usersum@2", "0") == b"orders\x00usersum@2\x000"
    assert reader_key("default", "j", "0") == reader_key("", "j", "0")  # the default stream, however written


def test_a_stream_lists_each_job_once_however_many_workers_it_runs() -> None:
    entries = [Reader("", "usersum", "0"), Reader("", "usersum", "1"), Reader("", "picky", "0"), Reader("payments", "paycount", "0")]
    assert by_stream(entries) == {"": ("picky", "usersum"), "payments": ("paycount",)}


@given(EDGES, st.sets(NAMES, min_size=1, max_size=6))
def test_the_tree_ends_only_when_every_reader_acked_its_own_edge(forwarded: int, readers: set[str]) -> None:
    edges = {r: reader_edge(forwarded, r) for r in readers}
    assert len(set(edges.values())) == len(readers) and all(edges.values())
    pending = xor_all(edges.values())  # what the gate's ack leaves in the tree
    for missing in readers:  # every reader but one acked: still open
        assert pending ^ xor_all(e for r, e in edges.items() if r != missing) != 0
    assert pending ^ xor_all(edges.values()) == 0


@given(EDGES, EDGES, NAMES, NAMES)
def test_two_readers_edges_of_two_records_do_not_pair_up(a: int, b: int, one: str, other: str) -> None:
    """Mixed, not salted: with edge ^ salt, one reader's edges of two records would XOR to the
    same value as another's, whatever the records."""
    if a != b and one != other:
        assert reader_edge(a, one) ^ reader_edge(b, one) != reader_edge(a, other) ^ reader_edge(b, other)
