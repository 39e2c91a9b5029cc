"""Nexmark: the standard streaming benchmark's event stream (persons, auctions, bids).

A deterministic generator after the public Nexmark specification, as Apache Beam's
``NexmarkGenerator`` implements it:

- Events are numbered 0, 1, 2, ... Of every 50, 1 is a new person, 3 are new auctions and 46 are
  bids (``PERSON/AUCTION/BID_PROPORTION``), in that order within the 50.
- Ids are dense and derived from the event number, so the stream needs no shared state: person
  and auction ids start at 1000, categories are 10..14.
- A bid goes to a "hot" auction (the newest multiple of ``HOT_AUCTION_RATIO``) half the time,
  otherwise to one of the auctions still open; its bidder is a hot person three times in four.
  Prices are log-uniform between 1.00 and 10,000.00 (in cents).
- Event n happens at ``base_time_ms + n * 1000 // rate``.

Every random choice of event ``n`` comes from a generator seeded with ``(seed, n)``, so event n
is the same whatever order, split or rate the stream is produced in.

Out of order: when ``max_delay_ms`` > 0, each event reaches the system up to that long after its
event time (a seeded delay per event) and :func:`arrival_order` sorts by arrival. Event time is
then out of order by at most ``max_delay_ms``: a watermark bound at least that large never
calls an event late, a smaller one does, and :func:`late_events` is the ground truth for it.
``late_ratio`` / ``late_delay_ms`` add events that are late by design (:meth:`Event.delay_ms`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from onceflow.v1.ingest_pb2 import IngestRecord

PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_AUCTION_RATIO = 2
HOT_BIDDER_RATIO = 4
HOT_SELLER_RATIO = 4
# Bids and sellers pick among the most recent persons / open auctions (Beam's defaults).
NUM_ACTIVE_PEOPLE = 1000
NUM_IN_FLIGHT_AUCTIONS = 100

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

Kind = Literal["person", "auction", "bid"]


@dataclass(frozen=True)
class NexmarkConfig:
    events: int = 10_000
    # Events per second of event time (the generator's notion of rate, not a send rate).
    rate: int = 1_000
    base_time_ms: int = 1_700_000_000_000
    max_delay_ms: int = 0
    # Late by design: this share of events arrives ``late_delay_ms`` after its event time (set it
    # well past the watermark bound, the window and the allowed lateness: those are the records
    # a job must send to compute.late).
    late_ratio: float = 0.0
    late_delay_ms: int = 0
    seed: int = 1


@dataclass(frozen=True)
class Event:
    number: int
    kind: Kind
    # Event time: the person's, auction's or bid's date_time.
    time_ms: int
    # When the event reaches the system (== time_ms unless the stream is out of order).
    arrival_ms: int
    fields: dict[str, Any]

    @property
    def delay_ms(self) -> int:
        return self.arrival_ms - self.time_ms

    @property
    def key(self) -> str:
        """Kafka-style partitioning key: bids by auction, auctions and persons by id."""
        return str(self.fields["auction"] if self.kind == "bid" else self.fields["id"])

    def payload(self) -> bytes:
        return json.dumps({"kind": self.kind, **self.fields}, separators=(",", ":")).encode()


def kind_of(number: int) -> Kind:
    offset = number % PROPORTION_DENOMINATOR
    if offset < PERSON_PROPORTION:
        return "person"
    if offset < PERSON_PROPORTION + AUCTION_PROPORTION:
        return "auction"
    return "bid"


def last_person_id(number: int) -> int:
    """Base-0 id of the newest person at or before event ``number``."""
    epoch, offset = divmod(number, PROPORTION_DENOMINATOR)
    return epoch * PERSON_PROPORTION + min(offset, PERSON_PROPORTION - 1)


def last_auction_id(number: int) -> int:
    """Base-0 id of the newest auction at or before event ``number`` (-1: none yet)."""
    epoch, offset = divmod(number, PROPORTION_DENOMINATOR)
    if offset < PERSON_PROPORTION:
        epoch, offset = epoch - 1, AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def _price(rng: random.Random) -> int:
    return round(math.pow(10.0, rng.random() * 6.0) * 100.0)


def _person_for(rng: random.Random, number: int, hot_ratio: int) -> int:
    newest = last_person_id(number)
    if rng.randrange(hot_ratio) > 0:
        return (newest // hot_ratio) * hot_ratio + FIRST_PERSON_ID
    active = min(newest + 1, NUM_ACTIVE_PEOPLE)
    return newest - rng.randrange(active) + FIRST_PERSON_ID


def _auction_for(rng: random.Random, number: int) -> int:
    newest = last_auction_id(number)
    if rng.randrange(HOT_AUCTION_RATIO) > 0:
        return (newest // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO + FIRST_AUCTION_ID
    in_flight = min(newest + 1, NUM_IN_FLIGHT_AUCTIONS)
    return newest - rng.randrange(in_flight) + FIRST_AUCTION_ID


def event(config: NexmarkConfig, number: int) -> Event:
    # One generator per event, seeded by (seed, number): event n never depends on the others.
    rng = random.Random(config.seed * 1_000_000_007 + number)
    time_ms = config.base_time_ms + number * 1000 // config.rate
    kind = kind_of(number)
    if kind == "person":
        person_id = last_person_id(number) + FIRST_PERSON_ID
        fields: dict[str, Any] = {
            "id": person_id,
            "name": f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
            "email_address": f"p{person_id}@example.com",
            "credit_card": " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4)),
            "city": rng.choice(US_CITIES),
            "state": rng.choice(US_STATES),
            "date_time": time_ms,
        }
    elif kind == "auction":
        initial = _price(rng)
        # Auctions stay open for a few seconds to a minute of event time.
        length_ms = rng.randrange(2_000, 60_000)
        fields = {
            "id": last_auction_id(number) + FIRST_AUCTION_ID,
            "item_name": f"item-{rng.randrange(1_000_000)}",
            "description": f"description-{rng.randrange(1_000_000)}",
            "initial_bid": initial,
            "reserve": initial + _price(rng),
            "date_time": time_ms,
            "expires": time_ms + length_ms,
            "seller": _person_for(rng, number, HOT_SELLER_RATIO),
            "category": FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES),
        }
    else:
        fields = {
            "auction": _auction_for(rng, number),
            "bidder": _person_for(rng, number, HOT_BIDDER_RATIO),
            "price": _price(rng),
            "channel": rng.choice(CHANNELS),
            "date_time": time_ms,
        }
    delay = rng.randrange(config.max_delay_ms + 1) if config.max_delay_ms else 0
    if config.late_ratio and rng.random() < config.late_ratio:
        delay = config.late_delay_ms
    return Event(number, kind, time_ms, time_ms + delay, fields)


def events(config: NexmarkConfig) -> Iterator[Event]:
    """Events in event-number (= event-time) order."""
    for number in range(config.events):
        yield event(config, number)


def arrival_order(config: NexmarkConfig) -> list[Event]:
    """Events in the order they reach the system: by arrival time, ties by number."""
    return sorted(events(config), key=lambda e: (e.arrival_ms, e.number))


def late_events(arrivals: list[Event], bound_ms: int) -> list[Event]:
    """Ground truth for a watermark of ``max event time seen - bound_ms`` over one ordered
    stream: the events whose time is already behind the watermark when they arrive."""
    late, newest = [], None
    for e in arrivals:
        if newest is not None and e.time_ms < newest - bound_ms:
            late.append(e)
        newest = e.time_ms if newest is None else max(newest, e.time_ms)
    return late


def ingest_records(arrivals: list[Event], id_prefix: str = "nexmark") -> list[IngestRecord]:
    """The events as ingest takes them: record_id ``<id_prefix>:<n>``, the partitioning key and
    the event time. Another run over the same pipeline needs another prefix: the gate would drop
    the same ids as duplicates."""
    from onceflow.v1.ingest_pb2 import IngestRecord

    return [
        IngestRecord(record_id=f"{id_prefix}:{e.number}".encode(), key=e.key.encode(), event_time_ms=e.time_ms, payload=e.payload())
        for e in arrivals
    ]
