"""The console's pure parts, and its pages over a fleet that does not answer: no service runs
here, so every node must show DOWN and no page may wait longer than the fleet deadline."""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from onceflow.admin.fleet import DOWN, Endpoint, ServiceStatus
from onceflow.config import CommonSettings
from onceflow_tools.console import graph, records
from onceflow_tools.console.app import Console, build
from onceflow_tools.console.settings import ConsoleSettings
from onceflow_tools.console.watch import FleetWatch, Sample, ServiceSeries, node_view
from onceflow_tools.process import free_port


def test_the_graph_follows_the_topology() -> None:
    found = {(source, target): topics for source, target, topics in graph.edges()}
    assert found == {
        ("ingest", "dedup"): ("ingest.records",),
        ("dedup", "compute"): ("dedup.records",),
        ("compute", "sink"): ("compute.results",),
        ("ingest", "acker"): ("acker.acks",),
        ("dedup", "acker"): ("acker.acks",),
        ("compute", "acker"): ("acker.acks",),
        ("sink", "acker"): ("acker.acks",),
        ("acker", "ingest"): ("acker.events",),
        ("source", "dedup"): ("ingest.records",),
        ("source", "acker"): ("acker.acks",),
    }
    places, edges = graph.layout(["ingest", "dedup", "compute", "sink", "acker", "source"])
    assert len(edges) == len(found) and set(places) == {"ingest", "dedup", "compute", "sink", "acker", "source"}


def test_a_restarted_instance_reads_as_rate_zero_not_negative() -> None:
    series = ServiceSeries(deque(maxlen=3))
    series.add(100, 50)
    series.last = (series.last[0] - 1.0, 100, 50)  # one second ago
    assert series.add(300, 150).in_per_s == pytest.approx(200, rel=0.05)
    series.last = (series.last[0] - 1.0, 300, 150)
    restarted = series.add(5, 1)
    assert restarted.in_per_s == 0 and restarted.out_per_s == 0
    assert len(series.samples) == 3


def test_a_node_is_degraded_while_one_of_its_instances_is_down() -> None:
    down = ServiceStatus(Endpoint("dedup", "127.0.0.1:1"), DOWN, error="UNAVAILABLE: refused")
    view = node_view("dedup", [down, down], Sample(0, 0, 0))
    assert view["health"] == DOWN and view["instances_up"] == 0 and len(view["errors"]) == 2
    assert node_view("dedup", [], Sample(0, 0, 0))["health"] == "UNCONFIGURED"


@pytest.mark.parametrize(
    ("record_id", "problem"),
    [("", "give a record_id"), ("a" * 257, "at most 256 bytes"), ("é" * 129, "at most 256 bytes"), ("<b>x</b>", "")],
)
def test_a_record_id_is_checked_the_way_ingest_checks_it(record_id: str, problem: str) -> None:
    assert problem in records.check_record_id(record_id) if problem else records.check_record_id(record_id) == ""


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung service."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_pages_over_a_dead_and_a_hung_fleet_show_down_and_escape_what_they_echo(silent_port: int) -> None:
    endpoints = [Endpoint("ingest", f"127.0.0.1:{free_port()}"), Endpoint("sink", f"127.0.0.1:{silent_port}")]
    settings = ConsoleSettings(deadline_s=0.5, poll_interval_s=0.2)
    watch = FleetWatch(endpoints, None, settings.poll_interval_s, settings.deadline_s).start()
    try:
        client = TestClient(build(Console(watch, settings, CommonSettings())), base_url="http://127.0.0.1:8090")
        nodes = client.get("/api/snapshot").json()["nodes"]
        assert {name: node["health"] for name, node in nodes.items()} == {"ingest": DOWN, "sink": DOWN}
        assert "DEADLINE_EXCEEDED" in nodes["sink"]["errors"][0], nodes["sink"]
        assert "UNAVAILABLE" in nodes["ingest"]["errors"][0], nodes["ingest"]

        page = client.get("/")
        assert page.status_code == 200 and 'data-node="sink"' in page.text

        missing = client.get("/services/<img src=x onerror=alert(1)>")
        assert missing.status_code == 404
        assert "&lt;img src=x onerror=alert(1)&gt;" in missing.text and "<img src=x" not in missing.text

        assert client.get("/tables/usersum", params={"page": "%%%"}).status_code == 400
        assert client.get("/tables/usersum", params={"limit": "0"}).status_code == 400
        long_id = client.get("/records", params={"id": "x" * 300})
        assert long_id.status_code == 400 and "at most 256 bytes" in long_id.text
        refused = client.post("/services/ingest/pause", data={"token": ""})
        assert refused.status_code == 400 and "refused" in refused.text
        assert client.post("/services/ingest/explode").status_code == 404
    finally:
        watch.stop()


def test_another_host_another_sites_post_and_one_stream_too_many_are_refused() -> None:
    """Issue 39: a page that rebinds its name to 127.0.0.1 cannot read the console (Host), a page
    elsewhere cannot post an action through the operator's browser (Origin), and live streams
    are bounded."""
    settings = ConsoleSettings(deadline_s=0.5, poll_interval_s=0.2, max_event_streams=1, allowed_hosts=["console.internal"])
    watch = FleetWatch([Endpoint("ingest", f"127.0.0.1:{free_port()}")], None, settings.poll_interval_s, settings.deadline_s)
    app = build(Console(watch.start(), settings, CommonSettings()))
    try:
        assert TestClient(app, base_url="http://attacker.example").get("/").status_code == 400
        assert TestClient(app, base_url="http://console.internal:8090").get("/api/snapshot").status_code == 200
        client = TestClient(app, base_url="http://127.0.0.1:8090")
        refused = client.post("/services/ingest/pause", data={"token": "t"}, headers={"Origin": "https://attacker.example"})
        assert refused.status_code == 403 and "another site" in refused.text
        same_site = client.post("/services/ingest/pause", data={"token": ""}, headers={"Origin": "http://127.0.0.1:8090"})
        assert same_site.status_code == 400 and "refused" in same_site.text  # the action's own refusal: no token
        with client.stream("GET", "/events") as first:
            assert first.status_code == 200
            second = client.get("/events")
            assert second.status_code == 503 and second.headers["retry-after"] == "5"
    finally:
        watch.stop()
