"""The two Redis stores' scripts against the real Redis: why their writes are exactly once and not
merely idempotent. Each refuses a stale owner (fencing) and a Redis that no longer holds what
its owner wrote (continuity: rolled back, flushed, restarted empty), and writes nothing then.
The sabotaged build skips the continuity check, and these same cases then pass silently."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow import faults
from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.state.store import StoreDiverged
from onceflow.txn.errors import FencedError
from onceflow_tools.verify.redis_faults import roll_back, snapshot

from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.store import APPLY_CHUNK, DedupStore
from onceflow_sink.tables import Change, Outcome, ResultTables

pytestmark = [pytest.mark.redis, pytest.mark.integration]

JOB = "totals"


@pytest.fixture
def client(infra: None) -> Iterator[tuple[redis.Redis, str]]:
    prefix = f"r{uuid.uuid4().hex[:8]}."
    connection = connect(CommonSettings().redis_url)
    yield connection, prefix
    delete_prefix(connection, prefix)


def test_the_sink_script_fences_stale_owners_and_refuses_a_redis_that_went_back(client) -> None:
    connection, prefix = client
    tables = ResultTables(connection, prefix)
    token, applied = tables.take_ownership(0)
    assert applied == -1
    assert tables.apply(0, token, -1, 9, [Change("+", JOB, "k", b"v1")]).outcome is Outcome.APPLIED
    saved = snapshot(connection, prefix)
    answer = tables.apply(0, token, 9, 19, [Change("+", JOB, "k", b"v2"), Change("+", JOB, "gone", b"x")])
    assert answer.outcome is Outcome.APPLIED and answer.stored == 19
    # A caller that believes an older position (a rewound batch) is refused whole: "k" stays v2.
    assert tables.apply(0, token, 9, 19, [Change("+", JOB, "k", b"v1")]).outcome is Outcome.DIVERGED
    assert tables.get(JOB, "k") == b"v2"

    roll_back(connection, prefix, saved)
    answer = tables.apply(0, token, 19, 29, [Change("-", JOB, "gone")])
    assert (answer.outcome, answer.stored) == (Outcome.DIVERGED, 9)
    assert tables.table(JOB) == {b"k": b"v1"}, "a diverged apply must write nothing"
    assert tables.apply(0, token, 19, None, ()).outcome is Outcome.DIVERGED  # the idle check sees it too

    # The rebuild: a newer token, no offset, then the partition replayed from its start.
    retaken = tables.retake(0, token)
    assert retaken.outcome is Outcome.RETAKEN and retaken.newest_token == token + 1
    token = retaken.newest_token
    assert tables.apply(0, token, -1, 9, [Change("+", JOB, "k", b"v1")]).outcome is Outcome.APPLIED
    assert tables.apply(0, token, 9, 19, [Change("+", JOB, "k", b"v2"), Change("+", JOB, "gone", b"x")]).outcome is Outcome.APPLIED
    assert tables.apply(0, token, 19, 29, [Change("-", JOB, "gone")]).outcome is Outcome.APPLIED
    assert tables.table(JOB) == {b"k": b"v2"}

    connection.delete(tables.meta_key(0))  # a flush of the partition's meta
    assert tables.apply(0, token, 29, 39, [Change("+", JOB, "k", b"v3")]).outcome is Outcome.DIVERGED

    new_token, _ = tables.take_ownership(0)  # a new owner: read before write
    assert tables.apply(0, token, -1, 39, [Change("-", JOB, "k")]).outcome is Outcome.FENCED
    assert tables.retake(0, token).outcome is Outcome.FENCED, "a zombie may not rebuild over the new owner"
    assert tables.get(JOB, "k") == b"v2" and tables.rejected(0) == 2
    assert tables.apply(0, new_token, -1, 39, [Change("-", JOB, "k")]).outcome is Outcome.APPLIED


def test_the_sabotaged_sink_script_trusts_a_rolled_back_redis(client) -> None:
    """The checker's other half: without continuity the same rollback goes unseen."""
    connection, prefix = client
    with faults.sabotaging("redis_unchecked"):
        tables = ResultTables(connection, prefix)
        token, _ = tables.take_ownership(0)
        tables.apply(0, token, -1, 9, [Change("+", JOB, "k", b"v1")])
        saved = snapshot(connection, prefix)
        tables.apply(0, token, 9, 19, [Change("+", JOB, "k", b"v2")])
        roll_back(connection, prefix, saved)
        assert tables.apply(0, token, 19, 29, [Change("+", JOB, "j", b"x")]).outcome is Outcome.APPLIED
        assert tables.get(JOB, "k") == b"v1"  # wrong, and nothing said so


def dedup_store(connection: redis.Redis, prefix: str) -> DedupStore:
    return DedupStore(connection, prefix, 0, BucketSpec(bucket_ms=1000, horizon_ms=10_000, expected_per_bucket=1000))


def test_the_dedup_store_refuses_to_decide_on_a_redis_that_went_back(client) -> None:
    connection, prefix = client
    store = dedup_store(connection, prefix)
    store.apply({b"a": b"1000"}, checkpoint=1)
    saved = snapshot(connection, prefix)
    store.apply({b"b": b"1000", b"c": b"2000"}, checkpoint=3)
    assert store.get(b"b") == b"1000"

    roll_back(connection, prefix, saved)
    # "b" is a Bloom "maybe"; Redis no longer has it. The checked read must not answer "new".
    with pytest.raises(StoreDiverged, match="checkpoint 1"):
        store.get(b"b")
    with pytest.raises(StoreDiverged):
        store.apply({b"d": b"2000"}, checkpoint=4)
    assert connection.hget(store.keys.ids, "d") is None, "a diverged apply must write nothing"

    # The rebuild: empty with a newer token, then the changelog from its start.
    token = store.token
    store.reset()
    assert store.token == token + 1 and store.checkpoint is None and len(store) == 0
    store.apply({b"a": b"1000", b"b": b"1000", b"c": b"2000"}, checkpoint=3)
    assert store.get(b"b") == b"1000"
    store.audit()

    connection.hdel(store.keys.ids, "c")  # a lost id alone (the count says otherwise)
    with pytest.raises(StoreDiverged, match="2 ids"):
        store.audit()


def test_a_dedup_store_with_more_than_one_chunk_is_checked_between_chunks(client) -> None:
    connection, prefix = client
    store = dedup_store(connection, prefix)
    many = {f"id-{i}".encode(): b"1000" for i in range(APPLY_CHUNK + 10)}
    store.apply(many, checkpoint=len(many))
    assert len(store) == len(many) and connection.hget(store.keys.meta, "checkpoint") == str(len(many)).encode()
    store.audit()


# Transactions of changes over a few ids: filed under a bucket, moved to another, or deleted (None).
_IDS = [f"id-{n}".encode() for n in range(6)]
_CHANGES = st.lists(st.dictionaries(st.sampled_from(_IDS), st.sampled_from([b"1000", b"2000", b"3000", None])), max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(transactions=_CHANGES)
def test_the_dedup_store_files_every_id_as_a_plain_dictionary_would(client, transactions) -> None:
    """The apply script files new ids in bulk and the rest one by one; whatever the mix, the ids
    hash, the bucket sets (what GC deletes by) and the count must be exactly a dictionary's."""
    connection, prefix = client
    store = DedupStore(connection, f"{prefix}{uuid.uuid4().hex[:6]}.", 0, BucketSpec(1000, 10_000, 1000))
    model: dict[bytes, bytes] = {}
    for n, changes in enumerate(transactions, start=1):
        store.apply(changes, checkpoint=n)
        for key, value in changes.items():
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        assert connection.hgetall(store.keys.ids) == model
        buckets: dict[bytes, set[bytes]] = {}
        for key, value in model.items():
            buckets.setdefault(value, set()).add(key)
        held = {key.rsplit(b":", 1)[1]: connection.smembers(key) for key in connection.scan_iter(match=f"{store.keys.bucket_prefix}*")}
        assert held == buckets, "a bucket set must hold exactly its ids, and an empty one must be gone"
        store.audit()  # the count matches what is held


def test_a_zombie_dedup_store_can_neither_write_nor_rebuild(client) -> None:
    connection, prefix = client
    zombie = dedup_store(connection, prefix)
    zombie.apply({b"a": b"1000"}, checkpoint=1)
    owner = dedup_store(connection, prefix)  # the replacement takes a newer token on assignment
    with pytest.raises(FencedError):
        zombie.apply({b"b": b"1000"}, checkpoint=2)
    with pytest.raises(FencedError):
        zombie.reset()
    assert owner.get(b"a") == b"1000" and len(owner) == 1


def scan_all(tables: ResultTables, prefix: str, limit: int) -> tuple[dict[str, bytes], int]:
    seen: dict[str, bytes] = {}
    pages, token = 0, b""
    while True:
        page, token = tables.scan(JOB, prefix, limit, token)
        pages += 1
        # A page may be short, even empty, with a token: one call does bounded work (issue 39).
        assert page == sorted(page) and len(page) <= limit
        seen.update(page)
        if not token:
            return seen, pages


def test_a_table_bigger_than_a_page_is_scanned_whole_with_page_tokens(client) -> None:
    # A 30-minute verify campaign's table outgrew one Scan (10,000 rows): the checker read
    # nothing and failed the run. Pages with a token return every row.
    connection, prefix = client
    tables = ResultTables(connection, prefix)
    rows = {f"{i}": f'{{"n": {i}}}'.encode() for i in range(25_000)}
    pipe = connection.pipeline(transaction=False)
    for start in range(0, len(rows), 5_000):
        pipe.hset(tables.table_key(JOB), mapping=dict(list(rows.items())[start : start + 5_000]))
    pipe.execute()
    seen, pages = scan_all(tables, "", 10_000)
    assert seen == rows and pages >= 3
    found, _pages = scan_all(tables, "2499", 10_000)  # a prefix: only its rows
    assert sorted(found) == ["2499", *[f"2499{d}" for d in range(10)]]


def test_a_small_table_is_paged_within_the_limit_though_redis_returns_it_in_one_step(client) -> None:
    # A small hash (listpack) comes back whole from one HSCAN: a CI run asked for 5 rows and
    # got 86. The rest of the step rides in the token; a deleted pending row is skipped.
    connection, prefix = client
    tables = ResultTables(connection, prefix)
    rows = {f"row-{i}": b"v%d" % i for i in range(100)}
    connection.hset(tables.table_key(JOB), mapping=rows)
    seen, pages = scan_all(tables, "row-1", 5)
    assert seen == {k: v for k, v in rows.items() if k.startswith("row-1")} and pages == 3  # 11 rows
    first, token = tables.scan(JOB, "", 7)
    connection.hdel(tables.table_key(JOB), "row-99")
    rest: dict[str, bytes] = dict(first)
    while token:
        page, token = tables.scan(JOB, "", 7, token)
        rest.update(page)
    assert rest == {k: v for k, v in rows.items() if k != "row-99" or k in dict(first)}
    with pytest.raises(ValueError, match="page token"):
        tables.scan(JOB, "", 7, b"\xff\xfe")
