"""The state fingerprint inside the merge hop (docs/decisions/0023): per owned partition, the
description its state was written under, made the loaded job's in the first transaction after
the assignment.

- No fingerprint (a fresh partition, or state written before fingerprints): the loaded job's is
  written, with the partition's first state write (the upgrade path: taken as the loaded job's
  once, logged).
- The same: nothing to do.
- Carried over (the aggregates reordered): every stored key is remapped by name in the store at
  once, and the remapped keys go to the changelog with the new fingerprint in that first
  transaction, so a restore sees either the old layout and the old fingerprint or the new ones.
  Partials the previous version left in ``compute.partials.<job>`` say their layout
  (``PartialAggregate.layout``) and are remapped the same way; the record keeps every layout it
  was carried over from (``carried``), so a later owner of the partition reads them too.
- Refused: the start check (lifecycle.check_state) stops a worker before it consumes anything;
  should another version write the partition after that check, every batch fails here as a
  whole (nothing commits, nothing is dead-lettered, the hop is unhealthy) with the reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate

from onceflow_compute.api import Aggregation, Job, JSONValue
from onceflow_compute.fingerprint import Decision, compare, describe, fingerprint, refusal_reason, remap
from onceflow_compute.lifecycle import fingerprint_key, parse, record
from onceflow_compute.merge.partials import decode_partials

log = logging.getLogger(__name__)

# Layouts a fingerprint record remembers having been carried over from (the oldest are forgotten first).
_CARRIED_KEPT = 16


def remap_state(job: Job, value: bytes, mapping: Sequence[int]) -> bytes:
    """One stored key's state in the loaded job's order: a plain aggregation's partials, or a
    windowed one's panes (each pane's partials, third in its entry)."""
    state = json.loads(value)
    if isinstance(job, Aggregation) and job.windowed:
        for pane in state:
            if pane[2] is not None:
                pane[2] = remap(pane[2], mapping)
    elif isinstance(job, Aggregation):
        state = remap(state, mapping)
    return json.dumps(state, separators=(",", ":")).encode()


class StateLayout:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.description = describe(job)
        self.fingerprint = fingerprint(self.description)
        self.key = fingerprint_key(job.name)
        self._state_prefix = f"{job.name}\x00".encode()
        # Layouts this worker reads partials in besides its own: fingerprint -> mapping.
        self.carried: dict[str, list[int]] = {}
        # Per partition: what the first transaction after the assignment writes.
        self._pending: dict[int, dict[bytes, bytes | None]] = {}
        self.refused = ""

    def on_assign(self, partitions: list[int], stores: Mapping[int, MemoryStore]) -> None:
        for partition in partitions:
            store = stores.get(partition)
            if store is not None:
                self._take(partition, store)

    def on_revoke(self, partitions: list[int]) -> None:
        for partition in partitions:
            self._pending.pop(partition, None)

    def _take(self, partition: int, store: MemoryStore) -> None:
        value = store.get(self.key)
        if value is None:
            if any(key.startswith(self._state_prefix) for key, _value in store.items()):
                log.warning(
                    "job %s partition %d: state without a fingerprint (written before fingerprints); "
                    "taken as the loaded job's %s, which is written with it now",
                    self.job.name, partition, self.fingerprint,
                )
            self._pending[partition] = {self.key: record(self.description, self.carried)}
            return
        stored, carried = parse(value)
        verdict = compare(stored, self.description)
        if verdict.decision is Decision.REFUSED:
            self.refused = refusal_reason(self.job.name, verdict)
            log.error("partition %d: %s", partition, self.refused)
            return
        if verdict.decision is Decision.IDENTICAL:
            self.carried.update(carried)
            return
        old = fingerprint(stored)
        changes: dict[bytes, bytes | None] = {
            key: remap_state(self.job, state, verdict.mapping) for key, state in store.items() if key.startswith(self._state_prefix)
        }
        # Each earlier layout now maps straight to the loaded job's order.
        self.carried.update({fp: [at[i] for i in verdict.mapping] for fp, at in carried.items()})
        self.carried[old] = list(verdict.mapping)
        while len(self.carried) > _CARRIED_KEPT:
            self.carried.pop(next(iter(self.carried)))
        changes[self.key] = record(self.description, self.carried)
        store.apply(changes, None)  # the store reads in the loaded job's order from now on
        self._pending[partition] = changes
        log.warning(
            "job %s partition %d: state of fingerprint %s carried over to %s by name (%s); %d keys remapped",
            self.job.name, partition, old, self.fingerprint, "; ".join(verdict.differences), len(changes) - 1,
        )

    def begin(self, batch: Batch[MemoryStore]) -> None:
        """First in every batch: refuse it whole if the state is another version's; else write
        what the assignment left pending (before any savepoint, so no rollback drops it)."""
        if self.refused:
            raise RuntimeError(self.refused)
        if not self._pending:
            return
        written = dict(self._pending)
        for partition, changes in written.items():
            overlay = batch.state(partition)
            for key, value in changes.items():
                if value is None:
                    overlay.delete(key)
                else:
                    overlay.put(key, value)

        def done() -> None:
            for partition, changes in written.items():
                if self._pending.get(partition) is changes:
                    del self._pending[partition]

        batch.after_commit.append(done)

    def partials(self, partial: PartialAggregate) -> list[JSONValue]:
        """A partial's values in the loaded job's order (ValueError: poison)."""
        assert isinstance(self.job, Aggregation)
        values = decode_partials(self.job, partial)
        if partial.layout in ("", self.fingerprint):
            return values
        mapping = self.carried.get(partial.layout)
        if mapping is None:
            raise ValueError(
                f"partials of {partial.key!r} were written under fingerprint {partial.layout}, "
                f"which this worker ({self.fingerprint}) neither runs nor carried its state over from"
            )
        return remap(values, mapping)
