"""The Nexmark queries' final tables in plain Python, written from the specification and the
jobs' documented row layouts, without any of the workers' code: the reference both streaming
and batch mode must equal. Each takes the events a job saw (the late ones already removed) and
returns result key -> row, as the checker folds compute.results."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from onceflow_tools.workloads.nexmark import Event

Table = dict[str, dict[str, Any]]

# The fields of onceflow_compute.jobs._nexmark.SCHEMA, in order.
FIELDS = ("kind", "id", "name", "city", "state", "seller", "category", "expires", "auction", "bidder", "price", "channel", "date_time")
WINDOW = 10_000
SLIDE = 2_000


def record_id(e: Event) -> str:
    return f"nx:{e.number}"


def q0(events: Iterable[Event]) -> Table:
    table = {}
    for e in events:
        fields = {"kind": e.kind, **e.fields}
        table[record_id(e)] = {"_record_id": record_id(e), **{f: fields.get(f) for f in FIELDS}}
    return table


def q1(events: Iterable[Event]) -> Table:
    return {
        record_id(e): {
            "_record_id": record_id(e), "auction": e.fields["auction"], "bidder": e.fields["bidder"],
            "price": e.fields["price"] * 89 // 100, "date_time": e.time_ms,
        }
        for e in events
        if e.kind == "bid"
    }


def q2(events: Iterable[Event]) -> Table:
    return {
        record_id(e): {"_record_id": record_id(e), "auction": e.fields["auction"], "price": e.fields["price"]}
        for e in events
        if e.kind == "bid" and e.fields["auction"] % 123 == 0
    }


def q3(events: Iterable[Event]) -> Table:
    events = list(events)
    sellers = {
        e.fields["id"]: {"person": e.fields["id"], "name": e.fields["name"], "city": e.fields["city"], "state": e.fields["state"], "date_time": e.time_ms}
        for e in events
        if e.kind == "person" and e.fields["state"] in ("OR", "ID", "CA")
    }
    table = {}
    for e in events:
        if e.kind == "auction" and e.fields["category"] == 10 and e.fields["seller"] in sellers:
            left = {"auction": e.fields["id"], "person": e.fields["seller"], "date_time": e.time_ms}
            table[f"{e.fields['id']}|{e.fields['seller']}"] = {"left": left, "right": sellers[e.fields["seller"]]}
    return table


def q4(events: Iterable[Event]) -> Table:
    events = list(events)
    auctions = {e.fields["id"]: e.fields for e in events if e.kind == "auction"}
    best: dict[int, int] = {}
    for e in events:
        auction = auctions.get(e.fields.get("auction", -1)) if e.kind == "bid" else None
        if auction is not None and e.time_ms <= auction["expires"]:
            best[auction["id"]] = max(best.get(auction["id"], 0), e.fields["price"])
    prices: dict[str, list[int]] = defaultdict(list)
    for auction_id, price in best.items():
        prices[str(auctions[auction_id]["category"])].append(price)
    if not prices:
        return {}
    averages = {category: sum(p) / len(p) for category, p in sorted(prices.items())}
    return {"all": {"scope": "all", "average_price": averages}}


def hopping(time_ms: int) -> list[tuple[int, int]]:
    last = time_ms // SLIDE * SLIDE
    return [(start, start + WINDOW) for start in range(last, time_ms - WINDOW, -SLIDE)]


def tumbling(time_ms: int) -> tuple[int, int]:
    start = time_ms // WINDOW * WINDOW
    return start, start + WINDOW


def q5(events: Iterable[Event]) -> Table:
    counts: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
    for e in events:
        if e.kind == "bid":
            for window in hopping(e.time_ms):
                counts[window][e.fields["auction"]] += 1
    table = {}
    for (start, end), bids in counts.items():
        most = max(bids.values())
        hottest = {"auctions": sorted(a for a, n in bids.items() if n == most), "bids": most}
        table[f"all@{start}-{end}"] = {"scope": "all", "hottest": hottest, "window_start": start, "window_end": end}
    return table


def q7(events: Iterable[Event]) -> Table:
    prices: dict[tuple[int, int], list[int]] = defaultdict(list)
    for e in events:
        if e.kind == "bid":
            prices[tumbling(e.time_ms)].append(e.fields["price"])
    return {
        f"all@{start}-{end}": {"scope": "all", "highest": max(p), "bids": len(p), "window_start": start, "window_end": end}
        for (start, end), p in prices.items()
    }


def q8(events: Iterable[Event]) -> Table:
    events = list(events)
    people: dict[tuple[int, tuple[int, int]], dict[str, Any]] = {}
    for e in events:
        if e.kind == "person":
            people[(e.fields["id"], tumbling(e.time_ms))] = {"person": e.fields["id"], "name": e.fields["name"], "date_time": e.time_ms}
    table = {}
    for e in events:
        if e.kind == "auction":
            window = tumbling(e.time_ms)
            person = people.get((e.fields["seller"], window))
            if person is not None:
                right = {"auction": e.fields["id"], "person": e.fields["seller"], "date_time": e.time_ms}
                start, end = window
                table[f"{person['person']}|{e.fields['id']}@{start}-{end}"] = {
                    "left": person, "right": right, "window_start": start, "window_end": end,
                }
    return table


ANSWERS: dict[str, Callable[[Iterable[Event]], Table]] = {
    "nexmark_q0": q0, "nexmark_q1": q1, "nexmark_q2": q2, "nexmark_q3": q3,
    "nexmark_q4": q4, "nexmark_q5": q5, "nexmark_q7": q7, "nexmark_q8": q8,
}
