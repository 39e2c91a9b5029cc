"""Per-partition key-value stores: a materialisation of one changelog partition."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol


class KeyValueStore(Protocol):
    """Bytes to bytes, plus the offset of the next changelog record it has not applied."""

    @property
    def checkpoint(self) -> int | None:
        """Next changelog offset to apply; None when nothing was ever restored."""

    def get(self, key: bytes) -> bytes | None: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]: ...

    def apply(self, changes: Mapping[bytes, bytes | None], checkpoint: int | None) -> None:
        """Apply committed changes (None deletes) and advance the checkpoint."""

    def close(self) -> None: ...


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

    def close(self) -> None:
        self._data.clear()
