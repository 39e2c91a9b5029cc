"""Per-partition key-value stores: a materialisation of one changelog partition."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, TypeVar


class StoreDiverged(Exception):
    """A store outside the process no longer holds what this owner last wrote to it (Redis lost
    or rolled back writes: a failover to a lagging replica, an fsync window, a flush). Nothing
    it answers can be trusted until it is rebuilt from the changelog."""

    def __init__(self, partition: int, reason: str) -> None:
        super().__init__(f"store of partition {partition} diverged: {reason}")
        self.partition = partition
        self.reason = reason


class StoreUnavailable(Exception):
    """The store cannot be reached or refuses writes (Redis down, MISCONF): retry later. Whether
    the last write landed is unknown, so the store is checked again before it is trusted."""


class KeyValueStore(Protocol):
    """Bytes to bytes, plus the offset of the next changelog record it has not applied."""

    @property
    def checkpoint(self) -> int | None:
        """Next changelog offset to apply; None when nothing was ever restored."""

    def get(self, key: bytes) -> bytes | None: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]: ...

    def apply(self, changes: Mapping[bytes, bytes | None], checkpoint: int | None) -> None:
        """Apply committed changes (None deletes) and advance the checkpoint."""

    def reset(self) -> None:
        """Forget everything (and, for a shared store, take a newer ownership token): the start
        of a rebuild from the changelog's beginning."""

    def audit(self) -> None:
        """Raise StoreDiverged if the store no longer holds what this owner wrote (cheap)."""

    def close(self) -> None: ...


# The store type of a hop: a loop, its partition stores, its batches and its stage are generic
# in it, so a stage reads its own store's methods (the gate's Bloom filters) without a downcast.
StoreT = TypeVar("StoreT", bound=KeyValueStore)


class MemoryStore:
    """A dict. It starts empty, so every assignment restores the whole (compacted) changelog."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._checkpoint: int | None = None

    @property
    def checkpoint(self) -> int | None:
        return self._checkpoint

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self._data.items()))

    def __len__(self) -> int:
        return len(self._data)

    def apply(self, changes: Mapping[bytes, bytes | None], checkpoint: int | None) -> None:
        for key, value in changes.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value
        if checkpoint is not None and (self._checkpoint is None or checkpoint > self._checkpoint):
            self._checkpoint = checkpoint

    def reset(self) -> None:
        self._data.clear()
        self._checkpoint = None

    def audit(self) -> None:
        """Process memory cannot go back in time behind our back."""

    def close(self) -> None:
        self._data.clear()
