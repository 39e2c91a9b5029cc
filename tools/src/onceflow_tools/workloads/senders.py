"""Clients that push a generated workload through ingest the way real ones do: several at
once, retrying with the same record_ids, and now and then sending a batch again whose reply
they never saw (which the dedup gate must absorb)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence

from onceflow_client import IngestClient
from onceflow.v1.ingest_pb2 import IngestRecord


class Sender(threading.Thread):
    def __init__(
        self, address: str, batches: Sequence[Sequence[IngestRecord]], resend_ratio: float, seed: int, rate: float = 0.0
    ) -> None:
        super().__init__(daemon=True)
        self.rate = rate  # records/s this client offers; 0 = as fast as ingest takes them
        self.client = IngestClient(address)
        self.batches = batches
        self.rng = random.Random(seed)
        self.resend_ratio = resend_ratio
        self.sent_again: set[str] = set()
        self.sent_at_ms: list[float] = []  # per batch: when it was first sent (wall clock, for latencies)
        self.acknowledged = 0
        self.done = 0  # batches fully acknowledged, in order
        self.error: BaseException | None = None

    def run(self) -> None:
        started, sent = time.monotonic(), 0
        try:
            for batch in self.batches:
                if self.rate:
                    time.sleep(max(0.0, started + sent / self.rate - time.monotonic()))
                sent += len(batch)
                self.sent_at_ms.append(time.time() * 1000)
                self.client.ingest(batch)
                if self.rng.random() < self.resend_ratio:
                    # The reply was "lost": the client cannot tell, so it sends the same records again.
                    self.client.ingest(batch)
                    self.sent_again.update(r.record_id.decode() for r in batch)
                self.acknowledged += len(batch)
                self.done += 1
        except BaseException as exc:  # noqa: BLE001 - reported by whoever runs the senders
            self.error = exc
        finally:
            self.client.close()


class Senders:
    """``clients`` senders sharing ``records`` in batches (dealt round-robin, so the stream's
    order is roughly kept), offering ``rate`` records/s between them (0: as fast as they can)."""

    def __init__(
        self, address: str, records: Sequence[IngestRecord], batch: int, clients: int, resend_ratio: float, seed: int,
        rate: float = 0.0,
    ) -> None:
        batches = [records[i : i + batch] for i in range(0, len(records), batch)]
        self.senders = [Sender(address, batches[i::clients], resend_ratio, seed + i, rate / clients) for i in range(clients)]
        self.address = address
        self.late_resends = 0  # records sent again long after their first send
        self._late: list[threading.Thread] = []
        self._late_rng = random.Random(seed ^ 0x5EED)
        self._late_errors: list[BaseException] = []

    def start(self) -> None:
        for sender in self.senders:
            sender.start()

    def resend_earlier(self, batches: int) -> None:
        """Send again, in the background, ``batches`` batches acknowledged earlier: after a fault
        that may have lost state (a Redis rollback or flush), a lost dedup id shows only when
        its record comes again."""
        done = [batch for sender in self.senders for batch in sender.batches[: sender.done]]
        picked = self._late_rng.sample(done, min(batches, len(done)))
        if not picked:
            return

        def send() -> None:
            client = IngestClient(self.address)
            try:
                for batch in picked:
                    client.ingest(batch)
                    self.late_resends += len(batch)
            except BaseException as exc:  # noqa: BLE001 - reported through error
                self._late_errors.append(exc)
            finally:
                client.close()

        thread = threading.Thread(target=send, name="late-resends", daemon=True)
        thread.start()
        self._late.append(thread)

    def join_late(self) -> None:
        for thread in self._late:
            thread.join()

    def running(self) -> bool:
        return any(s.is_alive() for s in self.senders)

    def join(self) -> None:
        for sender in self.senders:
            sender.join()

    @property
    def acknowledged(self) -> int:
        return sum(s.acknowledged for s in self.senders)

    @property
    def sent_again(self) -> set[str]:
        return set().union(*(s.sent_again for s in self.senders))

    def sent_at_ms(self) -> dict[bytes, float]:
        """record_id -> when its batch was first sent."""
        return {
            record.record_id: at
            for sender in self.senders
            for batch, at in zip(sender.batches, sender.sent_at_ms, strict=False)
            for record in batch
        }

    @property
    def retries(self) -> int:
        return sum(s.client.retries for s in self.senders)

    @property
    def error(self) -> BaseException | None:
        return next((s.error for s in self.senders if s.error is not None), None) or next(iter(self._late_errors), None)
