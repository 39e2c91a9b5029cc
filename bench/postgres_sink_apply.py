"""The cost of exactly-once in the PostgreSQL sink: changes/s through ``PostgresTables.apply``
(one transaction per batch: the partition's row locked, token and continuity checked, the
changes COPYed into a staging table and upserted and deleted from it, the offset stored) against
plain batched upserts of the same changes without the fence, in the same run, with batches of 100 and 1000 changes
(issue 44's target: fenced >= 0.8x plain).

Every contender writes the same changes (JSON rows, 20% retractions, over 10,000 keys) to a
table of the same shape (the sink's: key, value, row and the typed columns generated from it),
one transaction per batch, each batch reduced to its rows' last changes first (an upsert cannot
touch a row twice in one statement):

- **plain COPY** (the baseline: the sink's statements without the fence): ``COPY`` (binary) into
  a temporary table, then one ``INSERT ... SELECT ... ON CONFLICT`` from it, and the delete, on
  one connection: no partitions row, no lock, no offset;
- **plain unnest**: ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO UPDATE`` and the delete;
- **plain unnest %b**: the same statement with binary parameters (``%b``): psycopg dumps the
  arrays in binary instead of escaping every element of a text array literal;
- **plain executemany**: psycopg's ``executemany`` of a one-row upsert (pipeline mode), and the
  delete;
- **apply, unchecked**: the sink's apply with the continuity check skipped (the
  ``postgres_unchecked`` sabotage); the lock, the token and the offset kept;
- **apply, fenced**: the sink's apply as deployed (its pool, its connection check).

Rounds are interleaved (the order rotated each round), each in fresh schemas; the best and the
median of each contender are reported, as ratios to plain COPY. At the end of each round every
table is compared with the fenced one.
Run: .venv/bin/python bench/postgres_sink_apply.py [--changes N] [--rounds R]   (also part of `make bench`)
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import typer
from psycopg import sql
from rich.console import Console
from rich.table import Table

from onceflow import faults
from onceflow.config import CommonSettings, repo_root
from onceflow.state.fencing import Outcome
from onceflow.state.result_store import Change
from onceflow_tools.infra import postgres

from onceflow_sink.postgres import PostgresTables, create_table, latest_per_row

console = Console(width=160)
JOB = "bench"
TARGET = 0.8
Batches = list[list[Change]]
Conn = psycopg.Connection[Any]


def _changes(count: int, seed: int = 1) -> list[Change]:
    rng = random.Random(seed)
    changes = []
    for i in range(count):
        key = f"row-{rng.randrange(10_000)}"
        if rng.random() < 0.2:
            changes.append(Change("-", JOB, key))
        else:
            row = {"user": f"u{rng.randrange(1_000)}", "total": rng.randrange(100_000), "count": i % 1_000}
            changes.append(Change("+", JOB, key, json.dumps(row).encode()))
    return changes


def _split(latest: dict[tuple[str, str], Change]) -> tuple[list[Change], list[str]]:
    upserts = [c for c in latest.values() if c.op == "+"]
    return upserts, [c.key for c in latest.values() if c.op == "-"]


def _delete(conn: Conn, table: sql.Identifier, keys: list[str]) -> None:
    if keys:
        conn.execute(sql.SQL("DELETE FROM {} WHERE key = ANY(%s::text[])").format(table), (keys,))


def _plain_unnest(conn: Conn, table: sql.Identifier, batches: Batches, placeholder: str = "%s") -> float:
    upsert = sql.SQL(
        "INSERT INTO {} (key, value, row) SELECT * FROM unnest(%s::text[], %s::bytea[], %s::jsonb[]) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, row = EXCLUDED.row".replace("%s", placeholder)
    ).format(table)
    started = time.perf_counter()
    for batch in batches:
        upserts, deletes = _split(latest_per_row(batch))
        with conn.transaction():
            if upserts:
                conn.execute(upsert, ([c.key for c in upserts], [c.value for c in upserts],
                                      [c.value.decode() for c in upserts]))
            _delete(conn, table, deletes)
    return time.perf_counter() - started


def _plain_copy(conn: Conn, table: sql.Identifier, batches: Batches) -> float:
    # ON COMMIT DELETE ROWS: each batch's transaction starts with an empty staging table.
    # row as text, parsed by the upsert's ::jsonb: psycopg's jsonb dumper would quote a str.
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS staging (key text, value bytea, row text) ON COMMIT DELETE ROWS")
    upsert = sql.SQL(
        "INSERT INTO {} (key, value, row) SELECT key, value, row::jsonb FROM staging "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, row = EXCLUDED.row"
    ).format(table)
    started = time.perf_counter()
    for batch in batches:
        upserts, deletes = _split(latest_per_row(batch))
        with conn.transaction():
            if upserts:
                with conn.cursor() as cur, cur.copy("COPY staging (key, value, row) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(["text", "bytea", "text"])
                    for c in upserts:
                        copy.write_row((c.key, c.value, c.value.decode()))
                conn.execute(upsert)
            _delete(conn, table, deletes)
    return time.perf_counter() - started


def _plain_executemany(conn: Conn, table: sql.Identifier, batches: Batches) -> float:
    upsert = sql.SQL(
        "INSERT INTO {} (key, value, row) VALUES (%s, %s, %s::jsonb) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, row = EXCLUDED.row"
    ).format(table)
    started = time.perf_counter()
    for batch in batches:
        upserts, deletes = _split(latest_per_row(batch))
        with conn.transaction():
            if upserts:
                with conn.cursor() as cur:
                    cur.executemany(upsert, [(c.key, c.value, c.value.decode()) for c in upserts])
            _delete(conn, table, deletes)
    return time.perf_counter() - started


def _apply(store: PostgresTables, batches: Batches, checked: bool = True) -> float:
    """The sink's apply; ``checked=False`` skips the continuity check (the sabotaged build)."""
    token, applied = store.take_ownership(0)
    sabotages = () if checked else ("postgres_unchecked",)
    with faults.sabotaging(*sabotages):
        # A guard: the comparison means something only if the sabotage reaches the apply. A check
        # (no writes) against a wrong position is refused only with the fence on.
        wrong = store.apply(0, token, applied + 7, None, []).outcome
        assert (wrong is Outcome.DIVERGED) is checked, f"the sabotage did not reach the apply ({wrong})"
        started = time.perf_counter()
        for batch in batches:
            last = applied + len(batch)
            assert store.apply(0, token, applied, last, batch).outcome is Outcome.APPLIED
            applied = last
        return time.perf_counter() - started


def _rows(conn: Conn, table: sql.Identifier) -> dict[str, tuple[bytes, str]]:
    """key -> (value, row as jsonb prints it): a row stored as a JSON string, not the object, differs."""
    query = sql.SQL("SELECT key, value, row::text FROM {}").format(table)
    return {str(k): (bytes(v), str(r)) for k, v, r in conn.execute(query).fetchall()}


# The baseline is the sink's own statements without the fence (COPY into a staging table, one
# upsert and one delete from it); the others are the alternatives measured against it.
CONTENDERS = ("plain COPY", "plain unnest", "plain unnest %b", "plain executemany", "apply, unchecked", "apply, fenced")
BASELINE = "plain COPY"
PLAIN: dict[str, Callable[[Conn, sql.Identifier, Batches], float]] = {
    "plain unnest": _plain_unnest, "plain unnest %b": partial(_plain_unnest, placeholder="%b"),
    "plain COPY": _plain_copy, "plain executemany": _plain_executemany,
}


def _table_name(contender: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in contender)


def _key(contender: str) -> str:
    """The contender's name in the JSON results: ``plain_unnest_b``, ``apply_fenced``."""
    return "_".join(part for part in _table_name(contender).split("_") if part)


def _round(url: str, batches: Batches, order: list[str]) -> dict[str, float]:
    """Each contender once, in ``order``, in fresh schemas: changes/s."""
    changes = sum(len(b) for b in batches)
    tag = uuid.uuid4().hex[:6]
    fenced = PostgresTables.connect(url, f"bench{tag}.", check=True)
    unchecked = PostgresTables.connect(url, f"bench{tag}u.", check=True)
    plain = PostgresTables.connect(url, f"bench{tag}p.", check=True)  # only for its schema
    first = next(c for b in batches for c in b if c.op == "+")
    rates: dict[str, float] = {}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            tables = {name: sql.Identifier(plain.schema, _table_name(name)) for name in PLAIN}
            for name in PLAIN:
                conn.execute(create_table(plain.schema, _table_name(name), first))
            for name in order:
                if name in PLAIN:
                    elapsed = PLAIN[name](conn, tables[name], batches)
                else:
                    elapsed = _apply(fenced if name == "apply, fenced" else unchecked, batches, checked=name == "apply, fenced")
                rates[name] = changes / elapsed
            expected = _rows(conn, sql.Identifier(fenced.schema, JOB))
            assert _rows(conn, sql.Identifier(unchecked.schema, JOB)) == expected, "apply, unchecked: another table"
            for name, table in tables.items():
                assert _rows(conn, table) == expected, f"{name}: another table than the fenced apply's"
    finally:
        for store in (fenced, unchecked, plain):
            store.drop_schema()
            store.close()
    return rates


def main(
    changes: int = typer.Option(30_000, help="Changes per measurement."),
    rounds: int = typer.Option(5, help="Interleaved rounds; the best of each contender is reported."),
    output: Path = typer.Option(Path("bench/results/postgres_sink_apply.json"), help="JSON results."),
) -> None:
    postgres.ensure_running()
    url = CommonSettings().postgres_url
    data = _changes(changes)
    result: dict[str, Any] = {"changes": changes, "rounds": rounds, "target": TARGET, "runs": {}}
    table = Table(title=f"PostgreSQL sink apply vs plain batched upserts, {changes:,} changes, same database, same run "
                  f"(best and median of {rounds}, interleaved); ratios to {BASELINE} (the sink's statements, unfenced)")
    for column in ("batch", *CONTENDERS, "fenced / unchecked"):
        table.add_column(column, justify="right")
    for size in (100, 1000):
        batches = [data[i : i + size] for i in range(0, len(data), size)]
        runs: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        for r in range(rounds):  # interleaved and rotated, so drift of the machine hits all alike
            order = list(CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[: r % len(CONTENDERS)])
            with console.status(f"batches of {size}: round {r + 1}/{rounds}"):
                for name, rate in _round(url, batches, order).items():
                    runs[name].append(rate)
            console.print(f"batches of {size}, round {r + 1}: " + ", ".join(f"{n} {runs[n][-1]:,.0f}" for n in CONTENDERS))
        best = {name: max(values) for name, values in runs.items()}
        median = {name: statistics.median(values) for name, values in runs.items()}
        base, median_base = best[BASELINE], median[BASELINE]
        result["runs"][str(size)] = runs
        result |= {f"{_key(name)}_{size}": rate for name, rate in best.items()}
        result |= {f"ratio_{_key(name)}_{size}": rate / base for name, rate in best.items()}
        result |= {f"median_ratio_{_key(name)}_{size}": rate / median_base for name, rate in median.items()}
        result[f"fenced_vs_unchecked_{size}"] = best["apply, fenced"] / best["apply, unchecked"]
        for label, rates, unit in ((f"{size}", best, base), (f"{size} (median)", median, median_base)):
            table.add_row(
                label, *(f"{rates[n]:,.0f}" + ("" if n == BASELINE else f" ({rates[n] / unit:.2f}x)") for n in CONTENDERS),
                f"{rates['apply, fenced'] / rates['apply, unchecked']:.2f}x",
            )
    console.print(table)
    for size in (100, 1000):
        ratio, median_ratio = result[f"ratio_apply_fenced_{size}"], result[f"median_ratio_apply_fenced_{size}"]
        console.print(f"batches of {size}: fenced ÷ {BASELINE} = {ratio:.2f}x best, {median_ratio:.2f}x median "
                      f"(target ≥ {TARGET}x): {'met' if ratio >= TARGET else 'NOT met'}")
    path = repo_root() / output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    console.print(f"written to {output}")


if __name__ == "__main__":
    typer.run(main)
