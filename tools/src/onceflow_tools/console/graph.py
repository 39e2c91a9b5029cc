"""The pipeline view's graph, drawn from `onceflow.topology`: a service per node, and an edge per
topic one service writes and another reads. Only the places on the page are chosen here."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow import topology
from onceflow.topology import Topic

NODE_W, NODE_H = 230, 215
# Columns of the record's way through, with the acker below the hops it hears from; the gaps
# leave room for the topics' names.
# The Kafka source, a second spout, sits under ingest (shown when infra/services.toml lists it).
_PLACES = {
    "ingest": (20, 20), "dedup": (350, 20), "compute": (680, 20), "sink": (1010, 20), "acker": (515, 345),
    "source": (20, 345),
}
WIDTH, HEIGHT = 1260, 570


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    topics: tuple[str, ...]
    path: str  # SVG path data
    label_x: float
    label_y: float


def edges() -> list[tuple[str, str, tuple[str, ...]]]:
    """(writer, reader, topics) between different services, from the hops' inputs and outputs;
    dead letters are left out (they end nowhere), and a service's edge to itself (compute's map
    hop to its merge hop through compute.partials.<job>) is shown inside its node."""
    writers: dict[Topic, set[str]] = {}
    for hop in topology.HOPS:
        for topic in hop.outputs:
            writers.setdefault(topic, set()).add(hop.service)
    found: dict[tuple[str, str], list[str]] = {}
    for hop in topology.HOPS:
        if hop.input is None or hop.input in topology.DLQS:
            continue
        for writer in sorted(writers.get(hop.input, ())):
            if writer != hop.service:
                found.setdefault((writer, hop.service), []).append(str(hop.input))
    return [(source, target, tuple(dict.fromkeys(topics))) for (source, target), topics in found.items()]


def _anchor(name: str, side: str) -> tuple[float, float]:
    x, y = _PLACES[name]
    return {
        "right": (x + NODE_W, y + NODE_H / 2), "left": (x, y + NODE_H / 2),
        "bottom": (x + NODE_W / 2, y + NODE_H), "top": (x + NODE_W / 2, y),
    }[side]


def layout(names: list[str]) -> tuple[dict[str, tuple[int, int]], list[Edge]]:
    """Where each node goes and the path of each edge between nodes that are on the page."""
    places = {name: _PLACES.get(name, (20, 330)) for name in names}
    drawn = []
    for source, target, topics in edges():
        if source not in places or target not in places:
            continue
        (sx, sy), (tx, ty) = places[source], places[target]
        if sy == ty:  # along the row
            (x1, y1), (x2, y2) = _anchor(source, "right" if sx < tx else "left"), _anchor(target, "left" if sx < tx else "right")
            path, lx, ly = f"M{x1},{y1} L{x2},{y2}", (x1 + x2) / 2, y1 - 8
        elif ty > sy:  # down to the acker
            (x1, y1), (x2, y2) = _anchor(source, "bottom"), _anchor(target, "top")
            path, lx, ly = f"M{x1},{y1} C{x1},{y1 + 60} {x2},{y2 - 60} {x2},{y2}", (x1 + x2) / 2, (y1 + y2) / 2
        else:  # back up from the acker (its events to ingest's replayer)
            (x1, y1), (x2, y2) = _anchor(source, "left"), _anchor(target, "bottom")
            x2 -= NODE_W / 4
            path, lx, ly = f"M{x1},{y1} C{x2},{y1} {x2},{y2 + 60} {x2},{y2}", x2 + 10, y1 - 14
        drawn.append(Edge(source, target, topics, path, lx, ly))
    return places, drawn
