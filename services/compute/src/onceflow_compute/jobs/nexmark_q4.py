"""Nexmark q4, average price per category: the average winning bid of the auctions in each
category. An auction's winning bid is its highest bid made before it expired.

One running row (key ``all``) whose combiner keeps, per auction, its category, its expiry and
its best valid bid so far: a bid that arrives before its auction waits in the auction's entry
until the expiry is known. Merge is associative and commutative (an entry takes whichever
partial knows the auction, and the best of both), so the row never depends on arrival order.
The state grows with the auctions; a production q4 would key it by auction and re-key the
winners by category in a second stage."""

import json
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Aggregation, Combine
from onceflow_compute.jobs._nexmark import SCHEMA

# Per auction id: [category, expires, best valid price, [[bid time, price], ...] waiting for the auction]
Entry = list[Any]


def _settle(entry: Entry) -> Entry:
    category, expires, best, waiting = entry
    if expires is None or not waiting:
        return entry
    valid = [price for time, price in waiting if time <= expires]
    return [category, expires, max([p for p in (best, *valid) if p is not None], default=None), []]


def _absorb(acc: dict[str, Entry], auction: str, update: Entry) -> None:
    category, expires, best, waiting = update
    mine = acc.get(auction, [None, None, None, []])
    bests = [p for p in (mine[2], best) if p is not None]
    acc[auction] = _settle(
        [
            mine[0] if mine[0] is not None else category,
            mine[1] if mine[1] is not None else expires,
            max(bests) if bests else None,
            mine[3] + waiting,
        ]
    )


class ClosingPrices:
    def init(self) -> dict[str, Entry]:
        return {}

    def add(self, acc: dict[str, Entry], value: Any) -> dict[str, Entry]:
        if value is not None:
            event = json.loads(value)
            if event["kind"] == "auction":
                _absorb(acc, str(event["id"]), [event["category"], event["expires"], None, []])
            else:
                _absorb(acc, str(event["auction"]), [None, None, None, [[event["date_time"], event["price"]]]])
        return acc

    def merge(self, a: dict[str, Entry], b: dict[str, Entry]) -> dict[str, Entry]:
        merged = dict(a)
        for auction, update in b.items():
            _absorb(merged, auction, update)
        return merged

    def result(self, acc: dict[str, Entry]) -> dict[str, float]:
        totals: dict[str, list[int]] = {}
        for category, _expires, best, _waiting in acc.values():
            if category is not None and best is not None:
                total = totals.setdefault(str(category), [0, 0])
                total[0] += best
                total[1] += 1
        return {category: total / count for category, (total, count) in sorted(totals.items())}


def auction_events(events: DataFrame) -> DataFrame:
    event = F.to_json(F.struct("kind", "id", "category", "expires", "auction", "price", "date_time"))
    return events.where(F.col("kind").isin("auction", "bid")).select(F.lit("all").alias("scope"), event.alias("event"))


job = Aggregation(
    name="nexmark_q4",
    schema=SCHEMA,
    key="scope",
    aggregates=(Combine("event", name="average_price", combiner=ClosingPrices()),),
    prepare=auction_events,
    doc="Nexmark q4: per category, the average winning bid (highest bid before expiry) of its auctions.",
)
