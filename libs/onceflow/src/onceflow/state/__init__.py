"""State: the changelog topic is the source of truth, a store per partition materialises it."""

from onceflow.state.overlay import StateTransaction
from onceflow.state.store import KeyValueStore, MemoryStore, StoreDiverged, StoreUnavailable
from onceflow.state.stores import PartitionStores

__all__ = [
    "KeyValueStore", "MemoryStore", "PartitionStores", "StateTransaction", "StoreDiverged", "StoreUnavailable",
]
