"""The uncommitted writes of one transaction over one partition's store.

Reads see the overlay first, then the store. The overlay reaches the store only after the
Kafka transaction commits; on abort it is dropped, so the store never holds a write that the
changelog does not.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Generic, Literal

from onceflow.state.store import StoreT


class _Absent(enum.Enum):
    """A key the overlay did not hold (None is a tombstone, so it cannot say that)."""

    ABSENT = enum.auto()


_ABSENT: Literal[_Absent.ABSENT] = _Absent.ABSENT


class StateTransaction(Generic[StoreT]):
    def __init__(self, store: StoreT) -> None:
        self._store = store
        self.changes: dict[bytes, bytes | None] = {}
        # (key, previous overlay entry or _ABSENT): lets one record's writes be rolled back
        # without copying the overlay per record.
        self._undo: list[tuple[bytes, bytes | None | _Absent]] = []

    @property
    def store(self) -> StoreT:
        """The committed store under this overlay (for what a stage keeps beside it)."""
        return self._store

    def get(self, key: bytes) -> bytes | None:
        if key in self.changes:
            return self.changes[key]
        return self._store.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._write(key, value)

    def delete(self, key: bytes) -> None:
        if self._store.get(key) is None:
            # Never committed (e.g. created and removed within this batch): drop it from the
            # overlay instead of writing a tombstone for a key the changelog never had.
            if key in self.changes:
                self._undo.append((key, self.changes.pop(key)))
            return
        self._write(key, None)

    def tombstone(self, key: bytes) -> None:
        """Delete a key the caller knows is committed, without reading the store first."""
        self._write(key, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every live key as this transaction sees it."""
        for key, value in self._store.items():
            if key not in self.changes:
                yield key, value
        for key, change in self.changes.items():
            if change is not None:
                yield key, change

    def _write(self, key: bytes, value: bytes | None) -> None:
        self._undo.append((key, self.changes.get(key, _ABSENT)))
        self.changes[key] = value

    def savepoint(self) -> int:
        return len(self._undo)

    def rollback_to(self, savepoint: int) -> None:
        while len(self._undo) > savepoint:
            key, previous = self._undo.pop()
            if previous is _ABSENT:
                self.changes.pop(key, None)
            else:
                self.changes[key] = previous
