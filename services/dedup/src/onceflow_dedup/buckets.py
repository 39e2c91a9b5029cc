"""MillWheel's dedup filter as a pure module: one Bloom filter per bucket of ingest time, kept
for a retention horizon. No Kafka, no Redis.

"No filter says maybe" proves a record_id new (the fast path: no exact-store read). "Maybe"
sends the caller to the exact store. Time here is ingest time, and "now" is the partition's
stream time (the newest ingest time it has seen), not the wall clock: a gate catching up on an
hour of backlog still deduplicates it. A record older than the horizon is not recognised: its
bucket is gone, by contract.
"""

from __future__ import annotations

from dataclasses import dataclass

from rbloom import Bloom


@dataclass(frozen=True, slots=True)
class BucketSpec:
    bucket_ms: int = 60_000
    horizon_ms: int = 3_600_000
    expected_per_bucket: int = 100_000
    false_positive_rate: float = 0.001

    def __post_init__(self) -> None:
        if self.bucket_ms <= 0 or self.horizon_ms < self.bucket_ms:
            raise ValueError("need 0 < bucket_ms <= horizon_ms")
        if self.expected_per_bucket <= 0 or not 0 < self.false_positive_rate < 1:
            raise ValueError("need expected_per_bucket > 0 and 0 < false_positive_rate < 1")

    @property
    def live_buckets(self) -> int:
        """How many buckets can be alive at once: the horizon's, plus the one filling now."""
        return self.horizon_ms // self.bucket_ms + 1

    @property
    def per_filter_rate(self) -> float:
        """A lookup asks every live filter, so their false positives add up: each filter gets
        its share of the configured rate, which then bounds the gate's rate as a whole."""
        return self.false_positive_rate / self.live_buckets


class BloomBuckets:
    def __init__(self, spec: BucketSpec) -> None:
        self.spec = spec
        self._filters: dict[int, Bloom] = {}

    def bucket_of(self, ingest_time_ms: int) -> int:
        """The bucket's start, in ms."""
        return ingest_time_ms - ingest_time_ms % self.spec.bucket_ms

    def beyond_horizon(self, ingest_time_ms: int, stream_time_ms: int) -> bool:
        return self.bucket_of(ingest_time_ms) + self.spec.horizon_ms <= self.bucket_of(stream_time_ms)

    def might_contain(self, record_id: str) -> bool:
        for bloom in self._filters.values():
            if record_id in bloom:
                return True
        return False

    def add(self, record_id: str, ingest_time_ms: int) -> int:
        bucket = self.bucket_of(ingest_time_ms)
        bloom = self._filters.get(bucket)
        if bloom is None:
            bloom = self._filters[bucket] = Bloom(self.spec.expected_per_bucket, self.spec.per_filter_rate)
        bloom.add(record_id)
        return bucket

    def expire(self, stream_time_ms: int) -> list[int]:
        """Drop the buckets past the horizon; returns their starts (so the exact store and the
        changelog can drop them too)."""
        gone = sorted(b for b in self._filters if b + self.spec.horizon_ms <= self.bucket_of(stream_time_ms))
        for bucket in gone:
            del self._filters[bucket]
        return gone

    @property
    def buckets(self) -> list[int]:
        return sorted(self._filters)

    @property
    def memory_bytes(self) -> int:
        return sum(bloom.size_in_bits // 8 for bloom in self._filters.values())
