"""`onceflow query` against a QueryClient stand-in: what the output says about the rows it did not
print, JSON that a script can use as JSON, rows not cut to 80 columns in a pipe, and key order
(issue 45). Against a real sink: tests/test_sink.py."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator

import pytest
from rich.table import Table
from typer.testing import CliRunner

from onceflow_tools.cli import query as query_cli

ROWS = {f"p{i:03}": json.dumps({"product": f"p{i:03}", "orders": i}).encode() for i in range(560)}
LONG = {"wide": json.dumps({"note": "x" * 300}).encode()}


class _FakeQuery:
    """A QueryClient over ``table``, scanning in a shuffled order (as Redis's HSCAN does), and
    handing out one row twice (as HSCAN may)."""

    table: dict[str, bytes] = ROWS

    def __init__(self, *_args: object) -> None:
        pass

    def __enter__(self) -> _FakeQuery:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def get(self, _job: str, key: str) -> bytes | None:
        return self.table.get(key)

    def scan(self, _job: str, prefix: str = "", page_size: int = 10_000) -> Iterator[tuple[str, bytes]]:
        keys = [k for k in self.table if k.startswith(prefix)]
        random.Random(7).shuffle(keys)
        for i, key in enumerate(keys):
            yield key, self.table[key]
            if i == 3:
                yield key, self.table[key]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[_FakeQuery]:
    monkeypatch.setattr(query_cli, "QueryClient", _FakeQuery)
    monkeypatch.delenv("ONCEFLOW_READ_TOKEN", raising=False)
    monkeypatch.setattr(_FakeQuery, "table", ROWS)
    return _FakeQuery


def _run(*args: str) -> tuple[str, str]:
    result = CliRunner().invoke(query_cli.app, [*args, "-a", "127.0.0.1:1"])
    assert result.exit_code in (0, 1), result.output
    return result.stdout, result.stderr


def test_a_limited_scan_says_the_table_has_more_and_all_reads_it_whole(fake: type[_FakeQuery]) -> None:
    out, _ = _run("scan", "purchases")
    assert "purchases: first 100 rows, more exist" in out
    assert out.rstrip().endswith("--limit 100 reached, 'purchases' has more rows: --all for every row")
    out, err = _run("scan", "purchases", "--json")
    assert len(json.loads(out)) == 100 and "--limit 100 reached" in err
    out, err = _run("scan", "purchases", "--all")
    assert "purchases: 560 rows" in out and err == ""
    out, err = _run("scan", "purchases", "--prefix", "p00")  # 10 rows, under the limit: no note
    assert "purchases: 10 rows" in out and err == ""


def test_json_values_are_json_in_key_order(fake: type[_FakeQuery]) -> None:
    out, _ = _run("scan", "purchases", "--all", "--json")
    rows = json.loads(out)
    assert [row["key"] for row in rows] == sorted(ROWS)  # each once, in key order, though scanned shuffled
    assert rows[0] == {"key": "p000", "value": {"product": "p000", "orders": 0}}
    out, _ = _run("scan", "purchases", "--limit", "5", "--json")
    keys = [row["key"] for row in json.loads(out)]
    assert len(keys) == 5 and keys == sorted(keys)
    out, _ = _run("get", "purchases", "p007", "--json")
    assert json.loads(out) == {"found": True, "value": {"product": "p007", "orders": 7}}


def test_a_value_that_is_not_json_stays_text(fake: type[_FakeQuery], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_FakeQuery, "table", {"a": b"v1", "b": b"\xff"})
    out, _ = _run("scan", "t", "--json")
    assert json.loads(out) == [{"key": "a", "value": "v1"}, {"key": "b", "value": "ff"}]


def test_a_table_in_a_pipe_is_not_cut_to_80_columns(fake: type[_FakeQuery], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # set in some test runs' environment (a CI run had 80)
    monkeypatch.setattr(_FakeQuery, "table", LONG)
    out, _ = _run("scan", "t")
    assert LONG["wide"].decode() in out  # on one line, whole


def test_the_full_width_console_fits_a_terminal_and_not_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow_tools.cli.options import full_width_console  # here: the old code has none, the other tests still run on it

    monkeypatch.delenv("COLUMNS", raising=False)
    pipe = io.StringIO()
    console = full_width_console(file=pipe)
    table = Table("key", "value")
    table.add_row("k", "y" * 500)
    console.print(table)
    assert "y" * 500 in pipe.getvalue()
    assert full_width_console(file=io.StringIO(), force_terminal=True, width=100).width == 100
    monkeypatch.setenv("COLUMNS", "120")
    assert full_width_console(file=io.StringIO()).width == 120
