"""The services' own Prometheus histograms, read the way a bench compares two moments: scrape
each service's ``/metrics`` before and after a phase and keep the difference per hop.
Benches read a hop's work from here (how many batches, Spark jobs, commits, and their time)
instead of timing it themselves."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterable, Mapping

SAMPLE = re.compile(r"^(?P<name>onceflow_[a-z_]+?)_(?P<part>sum|count)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)$")
HOP_LABEL = re.compile(r'(?:service|job)="([^"]+)"')

# (histogram, hop) -> (sum, count); the hop is the sample's service or job label.
Samples = dict[tuple[str, str], tuple[float, float]]


def parse(text: str, names: Iterable[str]) -> Samples:
    """The sums and counts of the histograms ``names`` in one exposition, added up per hop
    (a hop's several label sets, partitions say, make one figure)."""
    wanted = set(names)
    samples: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or match["name"] not in wanted:
            continue
        hop = HOP_LABEL.search(match["labels"] or "")
        entry = samples.setdefault((match["name"], hop.group(1) if hop else "?"), [0.0, 0.0])
        entry[0 if match["part"] == "sum" else 1] += float(match["value"])
    return {key: (total, count) for key, (total, count) in samples.items()}


def scrape(ports: Mapping[str, int], names: Iterable[str], timeout_s: float = 5.0) -> Samples:
    """``parse`` over every service's metrics endpoint on 127.0.0.1 (service -> port)."""
    names = tuple(names)
    samples: Samples = {}
    for port in ports.values():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s).read().decode()
        for key, (total, count) in parse(text, names).items():
            before = samples.get(key, (0.0, 0.0))
            samples[key] = (before[0] + total, before[1] + count)
    return samples


def difference(before: Samples, after: Samples) -> tuple[Samples, list[str]]:
    """What happened between two scrapes, and the hops whose counters went back (a service
    that restarted: its figure would be wrong, so it is left out and named)."""
    delta = {
        key: (total - before.get(key, (0.0, 0.0))[0], count - before.get(key, (0.0, 0.0))[1])
        for key, (total, count) in after.items()
    }
    reset = sorted(hop for (_name, hop), (_total, count) in delta.items() if count < 0)
    return {key: value for key, value in delta.items() if value[1] > 0}, reset
