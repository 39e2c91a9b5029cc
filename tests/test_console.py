"""The operations console in a real browser (Debian's Chromium, driven by Playwright) against a
running pipeline with a steady workload: the live graph, a gate killed with -9 and a sink that
hangs, a record's completed tree, a result table paged to its end, and admin actions that need
the token. Screenshots go to the test's temporary folder. The same pipeline serves the Grafana
dashboard's live check: every metric it queries is scraped from the running services."""

from __future__ import annotations

import re
import shutil
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from onceflow_client import IngestClient
from onceflow.config import CommonSettings, repo_root
from onceflow.v1 import admin_pb2, admin_pb2_grpc
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.jobs import lifecycle
from onceflow_tools.verify.supervisor import SERVICES, Supervisor
from onceflow_tools.workloads import usersum
from tests.conftest import COMPUTE_NOT_UNDER_TEST, TEST_SESSION_TIMEOUT_MS, eventually
from tests.test_observability import dashboard_metrics, sample, scrape
from tests.harness.process import ServiceProcess, free_port

pytestmark = [pytest.mark.console, pytest.mark.integration, pytest.mark.xdist_group("console")]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# The flags this machine's Chromium needs headless: no sandbox as root, and no background
# traffic to hosts a closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
ADMIN_TOKEN = "console-test-token"
USERS = 30
# A user whose name is HTML: it becomes a result row's key, which the page must show as text.
HTML_USER = '<b id="injected">bold</b><img src=x onerror="window.pwned=1">'
HTML_RECORD_ID = '<i id="injected-id">id</i>-1'


@dataclass
class Running:
    supervisor: Supervisor
    console: ServiceProcess
    url: str
    log_dir: Path
    known_record: str
    metrics_ports: dict[str, int]


def _status(address: str) -> admin_pb2.StatusReply:
    import grpc

    with grpc.insecure_channel(address) as channel:
        return admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=5)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def running(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    log_dir = tmp_path_factory.mktemp("console")
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    metrics_ports = {name: free_port() for name in SERVICES}
    supervisor = Supervisor(
        prefix, log_dir,
        settings={name: {"METRICS_PORT": str(port)} for name, port in metrics_ports.items()},
        env={
            "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            "ONCEFLOW_ADMIN_TOKEN": ADMIN_TOKEN, **COMPUTE_NOT_UNDER_TEST,
        },
    )
    stop = threading.Event()
    console = None
    try:
        supervisor.start_all()
        services_toml = log_dir / "services.toml"
        services_toml.write_text(
            "".join(f'[[service]]\nname = "{name}"\naddress = "{supervisor.address(name)}"\n\n' for name in SERVICES)
        )
        port = free_port()
        # The console's own environment has no admin token: its actions carry the operator's.
        console = ServiceProcess(
            "console", "onceflow_tools",
            {"ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_ADMIN_TOKEN": "", "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap},
            log_dir, cwd=repo_root(), args=("console", "--port", str(port), "--config", str(services_toml)),
        ).start()
        url = f"http://127.0.0.1:{port}"
        eventually(lambda: _http_ok(url + "/api/snapshot"), 60, f"the console on {url}")

        first = usersum.ingest_records(usersum.records(300, users=USERS, id_prefix="console"))
        odd = [
            IngestRecord(record_id=b"console-html", key=HTML_USER.encode(), payload=usersum.KeyedRecord("console-html", HTML_USER, 7).payload),
            IngestRecord(record_id=HTML_RECORD_ID.encode(), key=b"u0", payload=b"not json"),
        ]
        with IngestClient(supervisor.address("ingest")) as client:
            assert client.ingest([*first, *odd]).accepted == len(first) + 2

        def steady_load() -> None:
            # Keeps the rates moving, over the same users, for as long as the module runs.
            batch = 0
            with IngestClient(supervisor.address("ingest")) as client:
                while not stop.wait(0.3):
                    batch += 1
                    try:
                        client.ingest(usersum.ingest_records(usersum.records(40, users=USERS, id_prefix=f"load{batch}", seed=batch)))
                    except Exception:  # noqa: BLE001 - a test may have paused or killed a hop
                        pass

        threading.Thread(target=steady_load, name="load", daemon=True).start()
        yield Running(supervisor, console, url, log_dir, first[0].record_id.decode(), metrics_ports)
    finally:
        stop.set()
        if console is not None:
            console.ensure_dead()
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, running: Running, tmp_path: Path) -> Iterator[Page]:
    context = browser.new_context(base_url=running.url, viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    yield tab
    tab.screenshot(path=str(tmp_path / "last.png"), full_page=True)
    context.close()


def _health(page: Page, name: str) -> str:
    return page.locator(f'[data-node="{name}"] [data-field="health"]').first.inner_text()


def _rates(page: Page) -> tuple[int, list[str]]:
    """The page's update count and every node's two rates, read in one go: between separate reads
    an update can land and tear them."""
    return page.evaluate(
        """() => [Number(document.body.dataset.updates || 0),
                  [...document.querySelectorAll('[data-node] [data-field="in_per_s"], [data-node] [data-field="out_per_s"]')]
                    .map((element) => element.textContent)]"""
    )


def test_every_dashboard_metric_shows_up_in_a_live_scrape(running: Running) -> None:
    """Each service counts what it took in, the sink what it applied, compute the record that is
    not JSON as a dead letter, and every metric the Grafana dashboard queries is served."""
    def applied_and_dead_lettered() -> dict[str, str] | None:
        texts = {name: scrape(port) for name, port in running.metrics_ports.items()}
        done = sample(texts["sink"], "onceflow_records_out_total", service="sink") > 0
        lettered = sample(texts["compute"], "onceflow_dead_letters_total", service="compute") >= 1
        # The acker decides a tree a moment after the hops commit it: wait for the first too.
        decided = sample(texts["acker"], "onceflow_acker_trees_total", outcome="completed") > 0
        return texts if done and lettered and decided else None

    texts = eventually(applied_and_dead_lettered, 180, "the sink's first applies, compute's dead letter and a completed tree")
    for name in SERVICES:
        assert sample(texts[name], "onceflow_records_in_total", service=name) > 0, (name, texts[name][-3000:])
    served = {m for text in texts.values() for m in re.findall(r"^# TYPE (onceflow_[a-z_]+) ", text, re.M)}
    missing = {metric for metric in dashboard_metrics() if metric not in served and metric + "_total" not in served}
    assert not missing, f"the dashboard queries metrics no service serves: {sorted(missing)}"


def test_the_pipeline_view_shows_five_healthy_services_with_rates_that_move(page: Page, running: Running, tmp_path: Path) -> None:
    page.goto("/")
    page.evaluate("window.notReloaded = true")
    eventually(lambda: all(_health(page, name) == "SERVING" for name in SERVICES), 60, "five serving nodes")
    eventually(lambda: page.locator('[data-node="ingest"] [data-field="in_per_s"]').inner_text() not in ("0", "0.0"), 60,
               "ingest's rate above zero")
    updates, first = _rates(page)
    assert len(first) == 2 * len(SERVICES), first
    later = eventually(lambda: (read := _rates(page))[1] != first and read, 30, "the rates to change between two reads")
    assert later[0] > updates, f"the rates changed without an update from the stream: {first} -> {later[1]}"
    assert page.evaluate("window.notReloaded") is True, "the page reloaded instead of updating live"
    eventually(lambda: page.locator("#live").inner_text() == "live", 10, "the event stream connected")
    assert page.locator("svg path.edge").count() == 8
    pending = page.locator('[data-node="acker"] [data-field="figures.pending_trees"]')
    eventually(lambda: pending.inner_text().replace(",", "").isdigit(), 10, "the acker's pending trees shown")
    page.screenshot(path=str(tmp_path / "pipeline.png"), full_page=True)


def test_a_killed_gate_turns_down_and_recovers_and_a_hung_sink_never_blocks_the_page(
    page: Page, running: Running, tmp_path: Path
) -> None:
    page.goto("/")
    eventually(lambda: _health(page, "dedup") == "SERVING", 60, "the gate serving")
    running.supervisor.instances["dedup"].process.kill9()
    eventually(lambda: _health(page, "dedup") == "DOWN", 10, "the killed gate's node to show DOWN")
    page.screenshot(path=str(tmp_path / "gate-down.png"), full_page=True)
    assert running.supervisor.restart_exited() == ["dedup"]
    eventually(lambda: _health(page, "dedup") == "SERVING", 120, "the restarted gate's node to recover")

    sink = running.supervisor.instances["sink"].process
    sink.sigstop()
    try:
        page.goto("/")  # loads from the console's last snapshot, never from the hung sink
        eventually(lambda: _health(page, "sink") == "DOWN", 10, "the hung sink's node to show DOWN")
        page.goto("/services/sink")
        assert "DEADLINE_EXCEEDED" in page.locator(".instance .error").first.inner_text()
        page.screenshot(path=str(tmp_path / "sink-hung.png"), full_page=True)
    finally:
        sink.sigcont()
    page.goto("/")
    eventually(lambda: _health(page, "sink") == "SERVING", 60, "the resumed sink's node to recover")


def test_a_record_lookup_shows_a_completed_tree_and_unknown_ids_are_not_found(page: Page, running: Running) -> None:
    def completed() -> bool:
        page.goto(f"/records?id={running.known_record}")
        return page.locator("#trees tr.outcome-COMPLETED").count() >= 1

    eventually(completed, 120, f"a COMPLETED tree for {running.known_record}", interval_s=2)
    assert page.locator("#gate").inner_text().startswith("seen:")
    assert page.locator("#dead-letters tbody tr").first.inner_text() == "none"

    response = page.goto("/records?id=never-sent-42")
    assert response is not None and response.status == 404
    assert "not found" in page.locator("#not-found").inner_text()

    # A record id holding HTML, dead-lettered by compute (its payload is not JSON): shown as text.
    def lettered() -> bool:
        page.goto("/records?" + urllib.parse.urlencode({"id": HTML_RECORD_ID}))
        return page.locator("#dead-letters tbody tr td").count() > 1

    eventually(lettered, 120, "the HTML record's dead letter", interval_s=2)
    assert page.locator("code.record-id").inner_text() == HTML_RECORD_ID
    assert page.locator("#injected-id").count() == 0
    assert "compute.dlq" in page.locator("#dead-letters").inner_text()


def test_the_dead_letters_page_counts_reasons_filters_and_escapes(page: Page, running: Running) -> None:
    """Issue 45 item 2: `onceflow dlq list` in the console. The HTML record (its payload is not
    JSON) is compute's letter; its id is shown as text and links to its record lookup."""

    def listed() -> bool:
        page.goto("/letters?" + urllib.parse.urlencode({"job": "usersum"}))
        return HTML_RECORD_ID in page.locator("#letters").inner_text()

    eventually(listed, 120, "the HTML record's letter on the dead letters page", interval_s=2)
    assert page.locator("#injected-id").count() == 0 and page.evaluate("window.pwned") is None
    reasons = page.locator("#reasons tbody tr").all_inner_texts()
    assert reasons and all(row.split("\t")[1].startswith("compute") for row in reasons), reasons
    row = page.locator("#letters tbody tr", has_text="injected-id").first
    assert row.locator("td").nth(2).inner_text() == "compute" and row.locator("td").nth(6).inner_text() == "usersum"
    row.locator("a").click()  # the record id links to its lookup
    eventually(lambda: page.locator("code.record-id").count() == 1, 30, "the record page")
    assert page.locator("code.record-id").inner_text() == HTML_RECORD_ID
    page.goto("/letters?" + urllib.parse.urlencode({"job": "no-such-job"}))
    assert page.locator("#total").inner_text() == "0 letters"
    assert "no dead letters matching these filters" in page.locator("#letters").inner_text()
    response = page.goto("/letters?topic=ingest.records")
    assert response is not None and response.status == 400
    assert "no dead-letter topic" in page.locator("#problem").inner_text()


def test_paging_a_result_table_returns_every_row_once_and_escapes_keys(page: Page, running: Running) -> None:
    expected = {f"u{k}" for k in range(USERS)} | {HTML_USER}

    def pages() -> list[str]:
        keys: list[str] = []
        page.goto("/tables/usersum?limit=7")
        while True:
            keys += page.locator("#rows td.key").all_inner_texts()
            if page.locator("#next-page").count() == 0:
                assert page.locator("#last-page").count() == 1
                return keys
            page.locator("#next-page").click()

    keys = eventually(lambda: (k := pages()) and set(k) == expected and k, 120, "every user's row in the table", interval_s=2)
    assert len(keys) == len(set(keys)), f"rows returned twice: {sorted(k for k in keys if keys.count(k) > 1)}"
    assert page.locator("#injected").count() == 0 and page.evaluate("window.pwned") is None

    response = page.goto("/tables/no-such-job")
    assert response is not None and response.status == 404
    assert "no job named 'no-such-job'" in page.locator("#problem").inner_text()


def test_the_tables_page_lists_job_versions_and_a_table_says_which_it_reads(page: Page, running: Running) -> None:
    common = CommonSettings(topic_prefix=running.supervisor.prefix)
    lifecycle.deploy(common, "usersum", version=7, start=False)  # registered, never run: a shadow far behind
    page.goto("/tables")
    rows = page.locator("#versions tbody tr").all_inner_texts()
    assert any("usersum@7" in row and "shadow" in row for row in rows), rows
    page.goto("/tables/usersum")  # no version promoted: the plain name reads its own table
    assert page.locator("#version").count() == 0


def test_a_pause_needs_the_token_and_a_confirmation(page: Page, running: Running, tmp_path: Path) -> None:
    address = running.supervisor.address("compute")
    page.goto("/services/compute")
    assert page.locator("table.partitions tbody tr").count() >= 1
    eventually(lambda: page.locator("#rates polyline.in").get_attribute("points"), 10, "the rate chart drawn")

    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.locator('form[action="/services/compute/pause"] button').click()

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('form[action="/services/compute/pause"] button').click()
    page.wait_for_selector("#action-result")
    assert len(posts) == 1, f"a dismissed confirmation still sent the action: {posts}"
    assert "refused" in page.locator("#action-result").inner_text()
    assert "UNAUTHENTICATED" in page.locator("#action-result").inner_text()
    assert _status(address).state == "RUNNING"
    page.screenshot(path=str(tmp_path / "pause-refused.png"), full_page=True)

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('form[action="/services/compute/pause"] input[name="token"]').fill(ADMIN_TOKEN)
    page.locator('form[action="/services/compute/pause"] button').click()
    page.wait_for_selector("#action-result.done")
    # The loop takes a pause at its next poll.
    eventually(lambda: _status(address).state == "PAUSED", 30, "compute paused")

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('form[action="/services/compute/resume"] input[name="token"]').fill(ADMIN_TOKEN)
    page.locator('form[action="/services/compute/resume"] button').click()
    page.wait_for_selector("#action-result.done")
    eventually(lambda: _status(address).state == "RUNNING", 30, "compute running again")
