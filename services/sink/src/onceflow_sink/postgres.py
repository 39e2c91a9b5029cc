"""The result tables in PostgreSQL: the sink contract (``onceflow.state.result_store``) with one
SQL table per job, applied exactly once.

Each apply is one database transaction that, like the Redis script (``tables.py``):
1. locks the partition's row of ``"sink.partitions"`` (``FOR UPDATE``: one writer at a time)
   and checks its fencing token: a newer owner's means this instance is a zombie; the refusal is
   counted and nothing is written;
2. checks continuity: the row must hold exactly the offset this owner last applied (a restored
   older backup, a lost database, holds another: ``diverged``, and the sink rebuilds the
   partition from ``compute.results``);
3. upserts and deletes the rows, and stores the new offset, then commits. The rows and the
   offset commit or roll back together.

Layout (docs/services/sink.md), in a schema per topic prefix (``onceflow`` for none):
- ``"<job>"`` (``orders``, ``orders@2``): ``key`` (primary key, ``COLLATE "C"`` so a prefix scan
  is an index range), ``value`` (the row's bytes as compute wrote them: what Query answers),
  ``row`` (the same as jsonb), and one typed column per field of the first row the table took,
  generated from ``row`` (``bigint``, ``numeric``, ``text``, ``boolean`` or ``jsonb``; NULL where
  a later row's field has another type), so users can write plain SQL over them;
- ``"sink.partitions"``: per ``compute.results`` partition its owner token, last applied offset
  and refused writes;
- ``"sink.tables"``: each table's state fingerprint (docs/decisions/0023);
- ``"sink.aliases"``: each job's live version's table and the registry offset that said so.
A job name cannot hold a dot, so no job's table can be one of these three.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from onceflow import faults
from onceflow.state.fencing import Outcome
from onceflow.state.result_store import Answer, Change, ScanPage, StoreRefused
from onceflow.state.store import StoreUnavailable
from onceflow.topology import SEPARATOR
from onceflow.v1.sink_pb2 import ScanPosition

from onceflow_sink.pages import check_pinned, position_of

log = logging.getLogger(__name__)
T = TypeVar("T")
Work = Callable[["psycopg.Connection[Any]"], T]

# A btree entry holds about a third of a page (2704 bytes); a key near that fails its insert. Keys
# past this are refused (dead-lettered with the reason) before they reach the database.
MAX_KEY_BYTES = 2_000
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1
POOL_SIZE = 8  # the loop, Query's calls, the registry follower
CONNECT_WAIT_S = 5.0  # a connection from the pool, else the store is unavailable
# Unreachable, restarting, read-only (a standby, default_transaction_read_only), out of disk or
# memory: nothing was decided, a retry later will do.
UNAVAILABLE = (
    psycopg.OperationalError, PoolTimeout, psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientResources,
)
# The schema or a table vanished (a restored backup older than them, a DROP by hand): make them
# again, rebuild, and retry.
MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)
# A table altered by hand under a running sink (a column dropped or retyped): NOT_SERVING with the
# reason until an operator fixes it, never a crash loop. At start it is refused (StoreRefused).
ALTERED = (psycopg.errors.UndefinedColumn, psycopg.errors.DatatypeMismatch, psycopg.errors.NotNullViolation)
# What every table holds, by column: (type as information_schema names it).
JOB_COLUMNS = {"key": "text", "value": "bytea", "row": "jsonb"}
META_COLUMNS = {
    "sink.partitions": {"partition_id": "integer", "owner_token": "bigint", "applied_offset": "bigint", "rejected": "bigint"},
    "sink.tables": {"job": "text", "fingerprint": "text"},
    "sink.aliases": {"job": "text", "target": "text", "registry_offset": "bigint"},
}
_RESERVED_COLUMNS = {"key", "value", "row"}
# A batch's changes on their way in: per connection (temporary), emptied at each commit.
_STAGING = (
    'CREATE TEMP TABLE IF NOT EXISTS onceflow_staging (key text COLLATE "C", value bytea, row text, upsert boolean) '
    "ON COMMIT DELETE ROWS"
)
_COPY = "COPY onceflow_staging (key, value, row, upsert) FROM STDIN (FORMAT BINARY)"


def schema_of(topic_prefix: str) -> str:
    """The schema of a topic prefix's tables: ``onceflow``, or ``onceflow_<prefix>`` with every
    character a plain identifier cannot hold made ``_``."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in topic_prefix).strip("_")
    return (f"onceflow_{cleaned}" if cleaned else "onceflow")[:MAX_IDENTIFIER_BYTES]


class PostgresTables:
    """Every job's result table in one PostgreSQL database, as the sink contract asks."""

    name = "PostgreSQL"

    def __init__(self, pool: ConnectionPool, topic_prefix: str) -> None:
        self._pool = pool
        self.schema = schema_of(topic_prefix)
        self._ready = False  # the schema and its meta tables exist
        self._tables: set[str] = set()  # job tables known to exist
        self._lock = threading.Lock()
        self._started_at: Any = None  # pg_postmaster_start_time(): a restart changes it
        self._restarts = 0

    @classmethod
    def connect(cls, url: str, topic_prefix: str, *, check: bool = False) -> PostgresTables:
        """A store over a pool that (re)connects in the background. ``check``: reach the database
        now and make the schema; a database down at start is logged, not fatal: the sink is
        NOT_SERVING until it answers, as when it goes down later (never a crash loop)."""
        pool = ConnectionPool(
            url, min_size=1, max_size=POOL_SIZE, open=False, timeout=CONNECT_WAIT_S, name="sink-postgres",
            kwargs={"autocommit": True}, check=ConnectionPool.check_connection,
        )
        pool.open(wait=False)
        store = cls(pool, topic_prefix)
        if check:
            try:
                store.ensure_schema()
            except StoreUnavailable as exc:
                log.warning("sink: PostgreSQL at %s is not answering yet (%s): waiting for it", _display(url), exc)
        return store

    def close(self) -> None:
        self._pool.close()

    def drop_schema(self) -> None:
        """Every table of this topic prefix (a finished verify run's, a test's)."""
        with self._available("drop schema"), self._pool.connection() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
        self._ready = False
        self._tables.clear()

    # -- the sink's writes ----------------------------------------------------------------------

    def take_ownership(self, partition: int) -> tuple[int, int]:
        row = self._write(partition, lambda conn: conn.execute(
            self._sql(
                "INSERT INTO {partitions} (partition_id, owner_token) VALUES (%s, %s) ON CONFLICT (partition_id) "
                "DO UPDATE SET owner_token = GREATEST({partitions}.owner_token + 1, EXCLUDED.owner_token) "
                "RETURNING owner_token, applied_offset"
            ),
            (partition, int(time.time() * 1000)),
        ).fetchone())
        assert row is not None
        token, applied = row
        return int(token), -1 if applied is None else int(applied)

    def apply(
        self, partition: int, token: int, applied: int, last_offset: int | None, changes: Iterable[Change]
    ) -> Answer:
        latest = latest_per_row(changes)
        answer, made = self._write(
            partition, lambda conn: self._apply_in(conn, partition, token, applied, last_offset, latest)
        )
        self._tables.update(made)  # committed with the rows (a rolled back transaction made none)
        return answer

    def _apply_in(
        self, conn: psycopg.Connection[Any], partition: int, token: int, applied: int, last_offset: int | None,
        latest: dict[tuple[str, str], Change],
    ) -> tuple[Answer, list[str]]:
        """The answer, and the job tables this transaction made (only once the checks passed)."""
        newest, stored = self._lock_partition(conn, partition)
        if newest > token:
            return self._refuse(conn, partition, newest, stored), []
        unchecked = faults.sabotaged("postgres_unchecked")
        if not unchecked and (newest < token or stored != applied):
            return Answer(Outcome.DIVERGED, newest, stored), []
        if last_offset is None:
            return Answer(Outcome.CHECKED, newest, stored), []
        made = self._make_tables(conn, latest)
        self._write_rows(conn, latest)
        fingerprints = {change.job: change.fingerprint for change in latest.values() if change.fingerprint}
        if fingerprints:
            conn.execute(
                self._sql(
                    "INSERT INTO {tables} (job, fingerprint) SELECT * FROM unnest(%s::text[], %s::text[]) "
                    "ON CONFLICT (job) DO UPDATE SET fingerprint = EXCLUDED.fingerprint"
                ),
                (list(fingerprints), list(fingerprints.values())),
            )
        conn.execute(
            self._sql("UPDATE {partitions} SET applied_offset = %s WHERE partition_id = %s"), (last_offset, partition)
        )
        return Answer(Outcome.APPLIED, newest, last_offset), made

    def _write_rows(self, conn: psycopg.Connection[Any], latest: dict[tuple[str, str], Change]) -> None:
        """Each job's changes COPYed (binary) into a staging table, then one upsert and one
        delete from it: measured 1.2-3.3x an ``unnest`` of text arrays (bench/postgres_sink_apply.py),
        where psycopg spends most of the time escaping array elements."""
        by_job: dict[str, list[Change]] = {}
        for change in latest.values():
            by_job.setdefault(change.job, []).append(change)
        conn.execute(_STAGING)
        for index, (job, changes) in enumerate(by_job.items()):
            if index:
                conn.execute("DELETE FROM onceflow_staging")  # the previous job's, in this transaction
            with conn.cursor() as cursor, cursor.copy(_COPY) as copy:
                copy.set_types(["text", "bytea", "text", "bool"])  # row: jsonb parses it (psycopg's would quote a str)
                for change in changes:
                    upsert = change.op == "+"
                    copy.write_row((change.key, change.value if upsert else None, change.value.decode() if upsert else None, upsert))
            table = sql.Identifier(self.schema, job)
            if any(change.op == "+" for change in changes):
                conn.execute(sql.SQL(
                    "INSERT INTO {} (key, value, row) SELECT key, value, row::jsonb FROM onceflow_staging WHERE upsert "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, row = EXCLUDED.row"
                ).format(table))
            if any(change.op == "-" for change in changes):
                conn.execute(sql.SQL(
                    "DELETE FROM {} AS t USING onceflow_staging AS s WHERE t.key = s.key AND NOT s.upsert"
                ).format(table))

    def retake(self, partition: int, token: int) -> Answer:
        def claim(conn: psycopg.Connection[Any]) -> Answer:
            newest, stored = self._lock_partition(conn, partition)
            if newest > token:
                return self._refuse(conn, partition, newest, stored)
            conn.execute(
                self._sql(
                    "INSERT INTO {partitions} (partition_id, owner_token) VALUES (%s, %s) ON CONFLICT (partition_id) "
                    "DO UPDATE SET owner_token = EXCLUDED.owner_token, applied_offset = NULL"
                ),
                (partition, token + 1),
            )
            return Answer(Outcome.RETAKEN, token + 1, -1)

        return self._write(partition, claim)

    def _lock_partition(self, conn: psycopg.Connection[Any], partition: int) -> tuple[int, int]:
        """(newest token, stored offset) of the partition, its row locked to the end of the
        transaction; (0, -1) if it has no row (a store that lost it)."""
        row = conn.execute(
            self._sql("SELECT owner_token, applied_offset FROM {partitions} WHERE partition_id = %s FOR UPDATE"),
            (partition,),
        ).fetchone()
        if row is None:
            return 0, -1
        return int(row[0]), -1 if row[1] is None else int(row[1])

    def _refuse(self, conn: psycopg.Connection[Any], partition: int, newest: int, stored: int) -> Answer:
        conn.execute(self._sql("UPDATE {partitions} SET rejected = rejected + 1 WHERE partition_id = %s"), (partition,))
        return Answer(Outcome.FENCED, newest, stored)

    def refusal(self, change: Change) -> str:
        if len(change.job.encode()) > MAX_IDENTIFIER_BYTES:
            return f"job name {change.job[:40]!r}… is longer than a PostgreSQL table name may be ({MAX_IDENTIFIER_BYTES} bytes)"
        size = len(change.key.encode())
        if size > MAX_KEY_BYTES:
            return f"key of {size:,} bytes: a PostgreSQL primary key holds at most {MAX_KEY_BYTES:,} here"
        if "\x00" in change.key:
            return "key holds a NUL character, which PostgreSQL text cannot"
        if change.op == "+":
            return _row_refusal(change.value)
        return ""

    # -- bookkeeping ------------------------------------------------------------------------------

    def applied_offset(self, partition: int) -> int:
        row = self._run(f"sink partition {partition}", lambda conn: conn.execute(
            self._sql("SELECT applied_offset FROM {partitions} WHERE partition_id = %s"), (partition,)
        ).fetchone())
        return -1 if row is None or row[0] is None else int(row[0])

    def rejected(self, partition: int) -> int:
        row = self._run(f"sink partition {partition}", lambda conn: conn.execute(
            self._sql("SELECT rejected FROM {partitions} WHERE partition_id = %s"), (partition,)
        ).fetchone())
        return 0 if row is None else int(row[0])

    def watch_identity(self) -> None:
        started = self._run("sink", lambda conn: conn.execute("SELECT pg_postmaster_start_time()").fetchone())
        assert started is not None
        if self._started_at is not None and started[0] != self._started_at:
            self._restarts += 1
            log.warning("sink: PostgreSQL restarted (up since %s, was %s)", started[0], self._started_at)
        self._started_at = started[0]

    @property
    def restarts_seen(self) -> int:
        return self._restarts

    # -- versions --------------------------------------------------------------------------------

    def set_alias(self, job: str, table: str, offset: int) -> bool:
        row = self._run(f"alias {job}", lambda conn: conn.execute(
            self._sql(
                "INSERT INTO {aliases} (job, target, registry_offset) VALUES (%s, %s, %s) ON CONFLICT (job) "
                "DO UPDATE SET target = EXCLUDED.target, registry_offset = EXCLUDED.registry_offset "
                "WHERE {aliases}.registry_offset <= EXCLUDED.registry_offset RETURNING 1"
            ),
            (job, table, offset),
        ).fetchone())
        return row is not None

    def alias(self, job: str) -> tuple[str, int] | None:
        row = self._run(f"alias {job}", lambda conn: conn.execute(
            self._sql("SELECT target, registry_offset FROM {aliases} WHERE job = %s"), (job,)
        ).fetchone())
        return None if row is None else (str(row[0]), int(row[1]))

    def resolve(self, job: str) -> str:
        if SEPARATOR in job:
            return job
        alias = self.alias(job)
        return alias[0] if alias and alias[0] else job

    def drop_table(self, table: str) -> None:
        def drop(conn: psycopg.Connection[Any]) -> None:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.schema, table)))
            conn.execute(self._sql("DELETE FROM {tables} WHERE job = %s"), (table,))

        self._run(f"table {table}", drop)
        self._tables.discard(table)

    def table_fingerprint(self, job: str) -> str:
        row = self._run(f"table {job}", lambda conn: conn.execute(
            self._sql("SELECT fingerprint FROM {tables} WHERE job = %s"), (job,)
        ).fetchone())
        return "" if row is None else str(row[0])

    # -- reads -------------------------------------------------------------------------------------

    def get(self, table: str, key: str) -> bytes | None:
        if not self._table_exists(table):
            return None
        row = self._run(f"table {table}", lambda conn: conn.execute(
            sql.SQL("SELECT value FROM {} WHERE key = %s").format(sql.Identifier(self.schema, table)), (key,)
        ).fetchone())
        return None if row is None else bytes(row[0])

    def scan_page(
        self, job: str, prefix: str, limit: int, token: bytes = b"", *, deadline: float | None = None,
    ) -> ScanPage:
        """Rows in key order after the token's last key: an index range ``[prefix, next
        prefix)``, so one call reads at most ``limit`` rows whatever the table holds."""
        position = position_of(token)
        if position.table:
            check_pinned(job, position.table)
        table = position.table or self.resolve(job)
        if not self._table_exists(table):
            return ScanPage([], b"", table)
        bounds = [sql.SQL("key >= %(low)s")]
        params: dict[str, Any] = {"low": prefix, "limit": limit + 1}
        upper = _next_prefix(prefix)
        if upper is not None:
            bounds.append(sql.SQL("key < %(high)s"))
            params["high"] = upper
        if position.started:
            bounds.append(sql.SQL("key > %(after)s"))
            params["after"] = position.after_key
        query = sql.SQL("SELECT key, value FROM {} WHERE {} ORDER BY key LIMIT %(limit)s").format(
            sql.Identifier(self.schema, table), sql.SQL(" AND ").join(bounds)
        )
        timeout_ms = max(1, int((deadline - time.monotonic()) * 1000)) if deadline is not None else 0

        def read(conn: psycopg.Connection[Any]) -> list[tuple[str, bytes]]:
            with conn.transaction():
                if timeout_ms:
                    conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(timeout_ms)))
                return [(str(key), bytes(value)) for key, value in conn.execute(query, params).fetchall()]

        rows = self._run(f"table {table}", read)
        if len(rows) <= limit:
            return ScanPage(rows, b"", table)
        rows = rows[:limit]
        after = ScanPosition(table=table, after_key=rows[-1][0], started=True)
        return ScanPage(rows, after.SerializeToString(), table)

    def table(self, job: str) -> dict[bytes, bytes]:
        if not self._table_exists(job):
            return {}
        rows = self._run(f"table {job}", lambda conn: conn.execute(
            sql.SQL("SELECT key, value FROM {}").format(sql.Identifier(self.schema, job))
        ).fetchall())
        return {str(key).encode(): bytes(value) for key, value in rows}

    def _table_exists(self, table: str) -> bool:
        row = self._run(f"table {table}", lambda conn: conn.execute(
            "SELECT to_regclass(%s)", (sql.Identifier(self.schema, table).as_string(conn),)
        ).fetchone())
        return row is not None and row[0] is not None

    # -- schema ----------------------------------------------------------------------------------

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(
            partitions=sql.Identifier(self.schema, "sink.partitions"), tables=sql.Identifier(self.schema, "sink.tables"),
            aliases=sql.Identifier(self.schema, "sink.aliases"),
        )

    def ensure_schema(self) -> None:
        """The schema and its meta tables, made if missing (StoreUnavailable if unreachable)."""
        with self._available("schema"):
            self._ensure_schema()

    def _ensure_schema(self) -> None:
        if self._ready:
            return
        with self._pool.connection() as conn, conn.transaction():
            # Two sinks starting at once would race on the catalog: one at a time per schema.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            conn.execute(self._sql(
                "CREATE TABLE IF NOT EXISTS {partitions} (partition_id integer PRIMARY KEY, owner_token bigint NOT NULL, "
                "applied_offset bigint, rejected bigint NOT NULL DEFAULT 0)"
            ))
            conn.execute(self._sql("CREATE TABLE IF NOT EXISTS {tables} (job text PRIMARY KEY, fingerprint text NOT NULL)"))
            conn.execute(self._sql(
                "CREATE TABLE IF NOT EXISTS {aliases} (job text PRIMARY KEY, target text NOT NULL, registry_offset bigint NOT NULL)"
            ))
            self._check_tables(conn)
        self._ready = True

    def _check_tables(self, conn: psycopg.Connection[Any]) -> None:
        """StoreRefused naming the first table that lacks a column the sink writes, or holds it
        with another type (altered by hand): writing on it would fail or mislead."""
        columns: dict[str, dict[str, str]] = {}
        for table, column, kind in conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = %s",
            (self.schema,),
        ):
            columns.setdefault(str(table), {})[str(column)] = str(kind)
        for table, held in sorted(columns.items()):
            wanted = META_COLUMNS.get(table, JOB_COLUMNS)
            for column, kind in wanted.items():
                if held.get(column) != kind:
                    found = f"is {held[column]}" if column in held else "is missing"
                    raise StoreRefused(
                        f"PostgreSQL table {self.schema}.{table}: column {column} {found}, the sink writes {kind}; "
                        f"was it altered by hand? Drop the schema (DROP SCHEMA {self.schema} CASCADE) and the sink "
                        "rebuilds every table from compute.results"
                    )

    def _make_tables(self, conn: psycopg.Connection[Any], latest: dict[tuple[str, str], Change]) -> list[str]:
        """Each job's table, made in the transaction of its first change (typed columns from
        its first row); the jobs whose tables this made."""
        firsts: dict[str, Change] = {}
        for change in latest.values():
            if change.job not in self._tables and (change.job not in firsts or firsts[change.job].op == "-"):
                firsts[change.job] = change
        if firsts:
            # Two sinks making the same table at once would race on the catalog: one at a time.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))
            for job, first in firsts.items():
                conn.execute(create_table(self.schema, job, first))
        return list(firsts)

    # -- errors ----------------------------------------------------------------------------------

    @contextmanager
    def _available(self, what: str) -> Iterator[None]:
        try:
            yield
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"PostgreSQL unavailable ({what}): {_first_line(exc)}") from exc
        except ALTERED as exc:
            raise StoreUnavailable(
                f"PostgreSQL refuses the sink's write ({what}): {_first_line(exc)}; was a table of schema {self.schema} "
                "altered by hand? (docs/services/sink.md, 'PostgreSQL')"
            ) from exc

    def _write(self, partition: int, work: Work[T]) -> T:
        """``work(conn)`` in one transaction (the schema made first; made again and retried once
        if it vanished: a restored backup older than it)."""
        def transaction(conn: psycopg.Connection[Any]) -> T:
            with conn.transaction():
                return work(conn)

        return self._run(f"sink partition {partition}", transaction, rebuild=True)

    def _run(self, what: str, work: Work[T], rebuild: bool = False) -> T:
        """``work(conn)``; if the schema or a table vanished, made again and retried once. A
        write (``rebuild``) that finds a job's table gone also clears every partition's applied
        offset: the table's rows came from all of them, so every owner must find its partition
        diverged and replay it, or the rows before the loss would never come back."""
        with self._available(what):
            for attempt in (1, 2):
                self._ensure_schema()
                try:
                    with self._pool.connection() as conn:
                        return work(conn)
                except MISSING:
                    if attempt == 2:
                        raise
                    log.warning("sink: PostgreSQL lost the schema %s or a table of it: making them again", self.schema)
                    with self._lock:
                        self._ready = False
                        self._tables.clear()
                    if rebuild:
                        self._forget_positions()
        raise AssertionError("unreachable")

    def _forget_positions(self) -> None:
        self._ensure_schema()
        with self._pool.connection() as conn:
            cleared = conn.execute(self._sql("UPDATE {partitions} SET applied_offset = NULL")).rowcount
        log.warning("sink: every partition of schema %s will be rebuilt from compute.results (%d cleared)", self.schema, cleared)


def latest_per_row(changes: Iterable[Change]) -> dict[tuple[str, str], Change]:
    """Each row's last change of the batch: the rows end the same, in one statement per job."""
    latest: dict[tuple[str, str], Change] = {}
    for change in changes:
        latest.pop((change.job, change.key), None)
        latest[(change.job, change.key)] = change
    return latest


def _row_refusal(value: bytes) -> str:
    try:
        text = value.decode()
        row = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        return f"the row is not JSON ({exc})"
    if not isinstance(row, dict):
        return f"the row is a JSON {type(row).__name__}, not an object"
    if "\\u0000" in text:
        return "the row holds a NUL character, which PostgreSQL jsonb cannot"
    return ""


_JSON_TYPES = {bool: "boolean", str: "text"}


def _column(field: str, value: object) -> sql.Composable | None:
    """A typed column generated from ``row``'s field, or None for a field no column can name."""
    if field in _RESERVED_COLUMNS or not field or "\x00" in field or len(field.encode()) > MAX_IDENTIFIER_BYTES:
        return None
    name, got = sql.Identifier(field), sql.SQL("row -> {}").format(sql.Literal(field))
    text = sql.SQL("row ->> {}").format(sql.Literal(field))
    if isinstance(value, bool) or isinstance(value, str):
        kind = _JSON_TYPES[type(value)]
        json_type = "boolean" if kind == "boolean" else "string"
        expression = sql.SQL("CASE WHEN jsonb_typeof({}) = {} THEN ({})::{} END").format(
            got, sql.Literal(json_type), text, sql.SQL(kind)
        )
    elif isinstance(value, int):
        kind = "bigint"
        expression = sql.SQL("CASE WHEN jsonb_typeof({}) = 'number' AND ({}) ~ '^-?[0-9]{{1,18}}$' THEN ({})::bigint END").format(
            got, text, text
        )
    elif isinstance(value, float):
        kind = "numeric"
        expression = sql.SQL("CASE WHEN jsonb_typeof({}) = 'number' THEN ({})::numeric END").format(got, text)
    else:
        kind, expression = "jsonb", got
    return sql.SQL("{} {} GENERATED ALWAYS AS ({}) STORED").format(name, sql.SQL(kind), expression)


def create_table(schema: str, job: str, first: Change) -> sql.Composed:
    columns: list[sql.Composable] = [
        sql.SQL('key text COLLATE "C" PRIMARY KEY'), sql.SQL("value bytea NOT NULL"), sql.SQL("row jsonb NOT NULL"),
    ]
    if first.op == "+":
        row = json.loads(first.value)
        columns += [column for field, value in row.items() if (column := _column(field, value)) is not None]
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(sql.Identifier(schema, job), sql.SQL(", ").join(columns))


def _next_prefix(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (code point order, which
    is what ``COLLATE "C"`` sorts UTF-8 by); None for none (the empty prefix)."""
    while prefix:
        last = ord(prefix[-1]) + 1
        if 0xD800 <= last <= 0xDFFF:
            last = 0xE000
        if last <= 0x10FFFF:
            return prefix[:-1] + chr(last)
        prefix = prefix[:-1]
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _display(url: str) -> str:
    """The URL without a password."""
    scheme, _, rest = url.partition("://")
    if "@" in rest:
        user, _, host = rest.rpartition("@")
        rest = f"{user.split(':', 1)[0]}@{host}"
    return f"{scheme}://{rest}" if scheme else url
