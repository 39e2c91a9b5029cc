"""Streaming equi-joins with retractions: inner, left, right and full outer.

Both sides are kept per join key. A row that finds no partner yet is emitted padded with null
(for the outer side), and retracted the moment its first partner arrives, which replaces it
with the joined rows: the seed's streaming FULL OUTER JOIN example, ``undo`` rows included. A
table folding the changes equals the batch join of everything seen so far at every step.

State is bounded by event time: :meth:`StreamJoin.expire` drops rows older than the watermark
minus ``retention_ms`` (the join's time constraint: no row may join a partner further apart in
event time than that). Emitted results stay; an expired row simply finds no new partners.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

Row = Any


class JoinKind(str, enum.Enum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"

    @property
    def keeps_unmatched_left(self) -> bool:
        return self in (JoinKind.LEFT, JoinKind.FULL)

    @property
    def keeps_unmatched_right(self) -> bool:
        return self in (JoinKind.RIGHT, JoinKind.FULL)


@dataclass(frozen=True)
class JoinChange:
    op: Literal["+", "-"]
    left: Row | None
    right: Row | None


@dataclass
class _Side:
    # join key -> [(event time, row)] in arrival order
    rows: dict[str, list[tuple[int, Row]]] = field(default_factory=dict)


class StreamJoin:
    def __init__(self, kind: JoinKind, retention_ms: int | None = None) -> None:
        if retention_ms is not None and retention_ms < 0:
            raise ValueError("retention_ms must be >= 0")
        self.kind = kind
        self.retention_ms = retention_ms
        self._left = _Side()
        self._right = _Side()
        self.changed_keys: set[str] = set()

    def add_left(self, key: str, row: Row, event_time_ms: int = 0) -> list[JoinChange]:
        return self._add(key, row, event_time_ms, self._left, self._right, is_left=True)

    def add_right(self, key: str, row: Row, event_time_ms: int = 0) -> list[JoinChange]:
        return self._add(key, row, event_time_ms, self._right, self._left, is_left=False)

    def _add(self, key: str, row: Row, time: int, own: _Side, other: _Side, *, is_left: bool) -> list[JoinChange]:
        partners = [r for _t, r in other.rows.get(key, [])]
        mine = own.rows.setdefault(key, [])
        keeps_mine = self.kind.keeps_unmatched_left if is_left else self.kind.keeps_unmatched_right
        keeps_theirs = self.kind.keeps_unmatched_right if is_left else self.kind.keeps_unmatched_left

        def pair(a: Row | None, b: Row | None) -> tuple[Row | None, Row | None]:
            return (a, b) if is_left else (b, a)

        changes: list[JoinChange] = []
        if partners:
            if not mine and keeps_theirs:
                # The partners were emitted padded with null: their first match replaces that.
                changes += [JoinChange("-", *pair(None, partner)) for partner in partners]
            changes += [JoinChange("+", *pair(row, partner)) for partner in partners]
        elif keeps_mine:
            changes.append(JoinChange("+", *pair(row, None)))
        mine.append((time, row))
        self.changed_keys.add(key)
        return changes

    def expire(self, watermark: int) -> int:
        """Drop rows that can no longer join anything new; returns how many."""
        if self.retention_ms is None:
            return 0
        horizon = watermark - self.retention_ms
        dropped = 0
        for side in (self._left, self._right):
            for key in list(side.rows):
                kept = [(t, r) for t, r in side.rows[key] if t >= horizon]
                dropped += len(side.rows[key]) - len(kept)
                if len(kept) != len(side.rows[key]):
                    self.changed_keys.add(key)
                if kept:
                    side.rows[key] = kept
                else:
                    del side.rows[key]
        return dropped

    def rows_in_state(self) -> int:
        return sum(len(rows) for side in (self._left, self._right) for rows in side.rows.values())

    def snapshot(self, key: str) -> dict[str, list[list[Any]]] | None:
        left, right = self._left.rows.get(key, []), self._right.rows.get(key, [])
        if not left and not right:
            return None
        return {"left": [[t, r] for t, r in left], "right": [[t, r] for t, r in right]}

    def restore(self, key: str, snapshot: dict[str, list[list[Any]]] | None) -> None:
        for side, name in ((self._left, "left"), (self._right, "right")):
            rows = [(t, r) for t, r in (snapshot or {}).get(name, [])]
            if rows:
                side.rows[key] = rows
            else:
                side.rows.pop(key, None)
