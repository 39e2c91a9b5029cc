"""The PostgreSQL result store against a real PostgreSQL (started by the project's own scripts):
the sink contract as the Redis store answers it (tests/test_redis_stores.py). It refuses a stale
owner (fencing) and a database that no longer holds what its owner wrote (continuity: a restored
older backup, a lost database) and writes nothing then; the sabotaged build skips the check and
the same rollback then passes silently. Then what users meet: typed columns for plain SQL, page
tokens, the changes it cannot hold named, and the schema made again after it vanished."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from onceflow import faults
from onceflow.config import CommonSettings
from onceflow.state.fencing import Outcome
from onceflow.state.result_store import Change, StoreRefused
from onceflow.state.store import StoreUnavailable
from onceflow_tools.infra.postgres import PostgresServer

from onceflow_sink.postgres import MAX_KEY_BYTES, PostgresTables

pytestmark = [pytest.mark.sinks, pytest.mark.integration]

JOB = "totals"


@pytest.fixture(scope="module")
def postgres_url() -> str:
    PostgresServer.from_env().start()
    return CommonSettings().postgres_url


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresTables]:
    tables = PostgresTables.connect(postgres_url, f"t{uuid.uuid4().hex[:8]}.", check=True)
    yield tables
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(tables.schema)))
    tables.close()


Saved = dict[str, list[tuple[object, ...]]]


def snapshot(url: str, schema: str) -> Saved:
    """Every table of the schema's rows: what a base backup taken now would bring back."""
    with psycopg.connect(url) as conn:
        names = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))]
        return {
            name: conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, name))).fetchall()
            for name in names if name != JOB
        } | {JOB: conn.execute(sql.SQL("SELECT key, value, row FROM {}").format(sql.Identifier(schema, JOB))).fetchall()}


def roll_back(url: str, schema: str, saved: Saved) -> None:
    """The schema's tables back to ``saved`` in one transaction, as a restored backup leaves them."""
    with psycopg.connect(url) as conn, conn.transaction():
        for name, rows in saved.items():
            table = sql.Identifier(schema, name)
            conn.execute(sql.SQL("DELETE FROM {}").format(table))
            for row in rows:
                if name == JOB:
                    conn.execute(sql.SQL("INSERT INTO {} (key, value, row) VALUES (%s, %s, %s)").format(table),
                                 (row[0], row[1], psycopg.types.json.Jsonb(row[2])))
                else:
                    marks = sql.SQL(", ").join(sql.Placeholder() * len(row))
                    conn.execute(sql.SQL("INSERT INTO {} VALUES ({})").format(table, marks), row)


def test_the_apply_fences_stale_owners_and_refuses_a_database_that_went_back(store: PostgresTables, postgres_url: str) -> None:
    token, applied = store.take_ownership(0)
    assert applied == -1
    assert store.apply(0, token, -1, 9, [Change("+", JOB, "k", b'{"n": 1}')]).outcome is Outcome.APPLIED
    saved = snapshot(postgres_url, store.schema)
    answer = store.apply(0, token, 9, 19, [Change("+", JOB, "k", b'{"n": 2}'), Change("+", JOB, "gone", b'{"n": 0}')])
    assert answer.outcome is Outcome.APPLIED and answer.stored == 19
    # A caller that believes an older position (a rewound batch) is refused whole.
    assert store.apply(0, token, 9, 19, [Change("+", JOB, "k", b'{"n": 1}')]).outcome is Outcome.DIVERGED
    assert store.get(JOB, "k") == b'{"n": 2}'

    roll_back(postgres_url, store.schema, saved)
    answer = store.apply(0, token, 19, 29, [Change("-", JOB, "gone")])
    assert (answer.outcome, answer.stored) == (Outcome.DIVERGED, 9)
    assert store.table(JOB) == {b"k": b'{"n": 1}'}, "a diverged apply must write nothing"
    assert store.apply(0, token, 19, None, ()).outcome is Outcome.DIVERGED  # the idle check sees it too

    # The rebuild: a newer token, no offset, then the partition replayed from its start.
    retaken = store.retake(0, token)
    assert retaken.outcome is Outcome.RETAKEN and retaken.newest_token == token + 1
    token = retaken.newest_token
    assert store.apply(0, token, -1, 9, [Change("+", JOB, "k", b'{"n": 1}')]).outcome is Outcome.APPLIED
    assert store.apply(0, token, 9, 19, [Change("+", JOB, "k", b'{"n": 2}'), Change("+", JOB, "gone", b'{"n": 0}')]).outcome is Outcome.APPLIED
    assert store.apply(0, token, 19, 29, [Change("-", JOB, "gone")]).outcome is Outcome.APPLIED
    assert store.table(JOB) == {b"k": b'{"n": 2}'}

    new_token, resumed = store.take_ownership(0)  # a new owner: read before write
    assert resumed == 29
    assert store.apply(0, token, 29, 39, [Change("-", JOB, "k")]).outcome is Outcome.FENCED
    assert store.retake(0, token).outcome is Outcome.FENCED, "a zombie may not rebuild over the new owner"
    assert store.get(JOB, "k") == b'{"n": 2}' and store.rejected(0) == 2
    assert store.apply(0, new_token, 29, 39, [Change("-", JOB, "k")]).outcome is Outcome.APPLIED
    assert store.applied_offset(0) == 39 and store.get(JOB, "k") is None


def test_the_sabotaged_apply_trusts_a_rolled_back_database(store: PostgresTables, postgres_url: str) -> None:
    """The checker's other half: without the offset fence the same rollback goes unseen."""
    with faults.sabotaging("postgres_unchecked"):
        token, _ = store.take_ownership(0)
        store.apply(0, token, -1, 9, [Change("+", JOB, "k", b'{"n": 1}')])
        saved = snapshot(postgres_url, store.schema)
        store.apply(0, token, 9, 19, [Change("+", JOB, "k", b'{"n": 2}')])
        roll_back(postgres_url, store.schema, saved)
        assert store.apply(0, token, 19, 29, [Change("+", JOB, "j", b'{"n": 3}')]).outcome is Outcome.APPLIED
        assert store.get(JOB, "k") == b'{"n": 1}'  # wrong, and nothing said so


def test_a_batch_ends_each_row_at_its_last_change_and_users_read_typed_columns(store: PostgresTables, postgres_url: str) -> None:
    token, _ = store.take_ownership(1)
    first = {"user": "u1", "count": 2, "mean": 1.5, "open": True, "tags": ["a"]}
    changes = [
        Change("+", JOB, "u1", json.dumps(first).encode(), "fp-1"), Change("+", JOB, "u2", b'{"user": "u2", "count": 1}'),
        Change("-", JOB, "u2"), Change("+", JOB, "u3", b'{"user": "u3", "count": 5}'), Change("-", JOB, "u3"),
        Change("+", JOB, "u3", b'{"user": "u3", "count": "many"}'),  # another type: its column is NULL, the row kept
    ]
    assert store.apply(1, token, -1, 5, changes).outcome is Outcome.APPLIED
    assert store.table(JOB) == {b"u1": json.dumps(first).encode(), b"u3": b'{"user": "u3", "count": "many"}'}
    assert store.table_fingerprint(JOB) == "fp-1"
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(sql.SQL('SELECT key, "user", count, mean, open, tags FROM {} ORDER BY key').format(
            sql.Identifier(store.schema, JOB))).fetchall()
    assert [(k, u, c, float(m) if m is not None else None, o, t) for k, u, c, m, o, t in rows] == [
        ("u1", "u1", 2, 1.5, True, ["a"]), ("u3", "u3", None, None, None, None),
    ]


def test_changes_it_cannot_hold_are_named_before_they_reach_it(store: PostgresTables) -> None:
    assert "primary key" in store.refusal(Change("+", JOB, "k" * (MAX_KEY_BYTES + 1), b"{}"))
    assert "NUL" in store.refusal(Change("-", JOB, "a\x00b"))
    assert "not an object" in store.refusal(Change("+", JOB, "k", b"[1, 2]"))
    assert "not JSON" in store.refusal(Change("+", JOB, "k", b"\xff"))
    assert "NUL" in store.refusal(Change("+", JOB, "k", b'{"a": "\\u0000"}'))
    assert "table name" in store.refusal(Change("+", "j" * 70, "k", b"{}"))
    assert store.refusal(Change("+", JOB, "k", b'{"a": 1}')) == "" and store.refusal(Change("-", JOB, "k")) == ""


def test_a_table_is_paged_in_key_order_with_tokens_and_a_prefix_is_an_index_range(store: PostgresTables) -> None:
    token, _ = store.take_ownership(0)
    rows = {f"row-{i:04d}": b'{"n": %d}' % i for i in range(2_500)}
    rows["row-\U0010ffff"] = b'{"n": -1}'  # the highest code point: the prefix's upper bound still holds it
    assert store.apply(0, token, -1, 0, [Change("+", JOB, k, v) for k, v in rows.items()]).outcome is Outcome.APPLIED
    seen: dict[str, bytes] = {}
    page_token, pages = b"", 0
    while True:
        page = store.scan_page(JOB, "row-", 1_000, page_token)
        assert [k for k, _ in page.rows] == sorted(k for k, _ in page.rows) and len(page.rows) <= 1_000
        seen.update(page.rows)
        pages, page_token = pages + 1, page.token
        if not page_token:
            break
    assert seen == rows and pages == 3
    assert [k for k, _ in store.scan_page(JOB, "row-001", 100).rows] == [f"row-001{d}" for d in range(10)]
    assert store.scan_page(JOB, "nothing", 10).rows == [] and store.scan_page("never-made", "", 10).rows == []
    with pytest.raises(ValueError, match="page token"):
        store.scan_page(JOB, "", 7, b"\xff\xfe")
    other = store.scan_page(JOB, "", 1).token
    with pytest.raises(ValueError, match="not of job"):
        store.scan_page("another", "", 7, other)


def test_aliases_never_move_back_and_a_retired_table_is_dropped(store: PostgresTables) -> None:
    token, _ = store.take_ownership(0)
    store.apply(0, token, -1, 0, [Change("+", f"{JOB}@2", "k", b'{"n": 2}'), Change("+", f"{JOB}@1", "k", b'{"n": 1}')])
    assert store.resolve(JOB) == JOB  # no alias: its own table
    assert store.set_alias(JOB, f"{JOB}@2", 7)
    assert not store.set_alias(JOB, f"{JOB}@1", 5), "an older registry record must not move the alias back"
    assert store.resolve(JOB) == f"{JOB}@2" and store.alias(JOB) == (f"{JOB}@2", 7)
    store.drop_table(f"{JOB}@1")
    assert store.table(f"{JOB}@1") == {} and store.get(f"{JOB}@2", "k") == b'{"n": 2}'


def test_a_schema_that_vanished_is_made_again_and_the_partition_found_diverged(store: PostgresTables, postgres_url: str) -> None:
    """A base backup older than the schema itself: nothing is there. The next write makes the
    schema again and answers diverged (no token, no offset), so the sink rebuilds."""
    token, _ = store.take_ownership(0)
    store.apply(0, token, -1, 3, [Change("+", JOB, "k", b'{"n": 1}')])
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(store.schema)))
    answer = store.apply(0, token, 3, 4, [Change("+", JOB, "k", b'{"n": 2}')])
    assert (answer.outcome, answer.stored) == (Outcome.DIVERGED, -1)
    retaken = store.retake(0, token)
    assert store.apply(0, retaken.newest_token, -1, 4, [Change("+", JOB, "k", b'{"n": 2}')]).outcome is Outcome.APPLIED
    assert store.get(JOB, "k") == b'{"n": 2}'


def test_a_table_altered_by_hand_is_refused_at_start_and_named(store: PostgresTables, postgres_url: str) -> None:
    token, _ = store.take_ownership(0)
    store.apply(0, token, -1, 0, [Change("+", JOB, "k", b'{"n": 1}')])
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN value").format(sql.Identifier(store.schema, JOB)))
    prefix = store.schema.removeprefix("onceflow_") + "."
    with pytest.raises(StoreRefused, match=rf"{store.schema}\.{JOB}: column value is missing, the sink writes bytea"):
        PostgresTables.connect(postgres_url, prefix, check=True)
    # Under a running sink: NOT_SERVING with the reason (the loop retries), never a crash.
    with pytest.raises(StoreUnavailable, match="altered by hand"):
        store.apply(0, token, 0, 1, [Change("+", JOB, "k", b'{"n": 2}')])


def test_a_job_table_dropped_by_hand_is_rebuilt_from_every_partition(store: PostgresTables, postgres_url: str) -> None:
    """Its rows came from every partition: each owner must find its partition diverged and
    replay it, or the rows before the drop would never come back."""
    tokens = {p: store.take_ownership(p)[0] for p in (0, 1)}
    store.apply(0, tokens[0], -1, 4, [Change("+", JOB, "a", b'{"n": 1}')])
    store.apply(1, tokens[1], -1, 7, [Change("+", JOB, "b", b'{"n": 2}')])
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(store.schema, JOB)))
    assert store.apply(0, tokens[0], 4, 5, [Change("+", JOB, "c", b'{"n": 3}')]).outcome is Outcome.DIVERGED
    assert store.apply(1, tokens[1], 7, None, ()).outcome is Outcome.DIVERGED, "the other partition must rebuild too"
    for partition, replay in ((0, [Change("+", JOB, "a", b'{"n": 1}')]), (1, [Change("+", JOB, "b", b'{"n": 2}')])):
        token = store.retake(partition, tokens[partition]).newest_token
        assert store.apply(partition, token, -1, 4 if partition == 0 else 7, replay).outcome is Outcome.APPLIED
    assert store.table(JOB) == {b"a": b'{"n": 1}', b"b": b'{"n": 2}'}
