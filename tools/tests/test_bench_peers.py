"""How ``onceflow bench`` starts its peers: both apps get the same arguments, the Kafka Streams
peer runs as ``java -jar`` through the same process runner, and its Kafka Streams is the broker's
version. Nothing here starts a process or needs a broker (the bench itself is run by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onceflow.config import CommonSettings, repo_root
from onceflow_tools.bench import hops
from onceflow_tools.bench.report import Report
from onceflow_tools.bench.watch import BacklogRun
from onceflow_tools.process import ServiceProcess

pytestmark = pytest.mark.verify


def test_a_service_process_runs_its_module_or_an_explicit_command(tmp_path: Path) -> None:
    module = ServiceProcess("quix-dedup", "apps", {}, tmp_path, args=["dedup", "--quiet"], python="/venv/python")
    assert module.argv == ["/venv/python", "-m", "apps", "dedup", "--quiet"]
    command = ServiceProcess("kstreams-dedup", "", {}, tmp_path, command=["java", "-jar", "peer.jar", "dedup"])
    assert command.argv == ["java", "-jar", "peer.jar", "dedup"]
    assert ServiceProcess("acker", "onceflow_acker", {}, tmp_path).argv == [sys.executable, "-m", "onceflow_acker"]


def test_both_peers_get_the_same_arguments(tmp_path: Path) -> None:
    common = CommonSettings(topic_prefix="benchx.", kafka_bootstrap="127.0.0.1:9092")
    args = hops.peer_args("keyed_count", common, "benchx.g", 0.1, tmp_path / "state")
    assert args == [
        "keyed_count", "--bootstrap", "127.0.0.1:9092", "--input", "benchx.peer.input", "--output", "benchx.peer.output",
        "--group", "benchx.g", "--commit-interval", "0.1", "--state-dir", str(tmp_path / "state"), "--quiet",
    ]
    command = hops.kstreams_command("/jdk/bin/java", Path("peer.jar"), args)
    assert command[0] == "/jdk/bin/java"
    assert command[command.index("-jar") + 1] == "peer.jar"
    assert command[command.index("-jar") + 2:] == args


def test_every_contender_has_a_runner_and_a_transaction_size() -> None:
    assert set(hops.RUNNERS) == set(hops.HOPS)
    options = hops.HopOptions(quix_commit_interval_s=5, kstreams_commit_interval_s=0.1)
    sizes = hops.transaction_sizes(options)
    assert set(sizes) == set(hops.HOPS)
    assert "0.1 s" in sizes["kstreams-dedup"] and "5 s" in sizes["quix-keyed-count"]


def test_the_kafka_streams_peer_is_pinned_to_the_brokers_version() -> None:
    root = repo_root()
    peer = hops.kstreams_version(root / hops.KSTREAMS_DIR / "pom.xml")
    assert peer == hops.kstreams_version(root / "infra" / "kafka" / "pom.xml")


def test_a_pom_without_a_kafka_version_is_refused(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    with pytest.raises(ValueError, match="kafka.version"):
        hops.kstreams_version(pom)


def test_the_report_compares_the_hops_with_kafka_streams() -> None:
    report = Report(hops={
        "copier": BacklogRun(1000, 0.1), "dedup": BacklogRun(1000, 0.2), "kstreams-dedup": BacklogRun(1000, 0.1),
        "compute": BacklogRun(1000, 0.5), "kstreams-keyed-count": BacklogRun(1000, 0.1),
        "quix-dedup": BacklogRun(1000, 0.4),
    })
    ratios = report.ratios()
    assert ratios["dedup_vs_kstreams"] == pytest.approx(0.5)
    assert ratios["compute_vs_kstreams"] == pytest.approx(0.2)
    assert ratios["quix_dedup_vs_kstreams"] == pytest.approx(0.25)
    assert ratios["kstreams-dedup_vs_copier"] == pytest.approx(1.0)
    assert report.verdicts() == {
        "dedup_vs_quix": True, "dedup_vs_kstreams": True, "compute_vs_kstreams": False,
        "dedup_vs_copier": False, "compute_vs_copier": False,  # 0.5 and 0.2 against 0.75
    }


def test_a_peers_run_carries_its_whole_span_from_the_process_start() -> None:
    run = BacklogRun(150_000, 3.0, start_records=200_000, start_seconds=8.0)
    assert run.records_per_s == pytest.approx(50_000)
    assert run.records_per_s_from_start == pytest.approx(25_000)
    assert BacklogRun(1000, 1.0).records_per_s_from_start is None


class _Counting:
    """A group that commits 100 more records each time it is asked."""

    def __init__(self) -> None:
        self.done = 0

    def committed(self) -> int:
        self.done += 100
        return self.done


def test_time_backlog_spans_from_the_first_commit_and_from_the_start() -> None:
    import time

    from onceflow_tools.bench.watch import time_backlog

    started = time.monotonic() - 10.0  # the process started ten seconds ago
    run = time_backlog(_Counting(), 500, lambda: True, started=started)  # type: ignore[arg-type]
    assert run.records == 400  # the first commit's 100 are not timed
    assert run.start_records == 500
    assert run.start_seconds is not None and run.start_seconds >= 10.0 + run.seconds


class _SlowToAnswer:
    """A group whose coordinator takes 0.3 s to answer the question that finds it done."""

    def __init__(self) -> None:
        self.asked = 0

    def committed(self) -> int:
        import time

        self.asked += 1
        if self.asked == 1:
            return 100
        time.sleep(0.3)
        return 500


def test_a_slow_answer_is_dated_when_it_came_not_when_it_was_asked() -> None:
    from onceflow_tools.bench.watch import time_backlog

    run = time_backlog(_SlowToAnswer(), 500, lambda: True)  # type: ignore[arg-type]
    # Dated at the question, 400 records would have seemed to take 0.05 s (8,000/s).
    assert run.records == 400 and run.seconds >= 0.3


def test_a_peer_contender_may_name_its_commit_interval_and_nothing_else_may() -> None:
    assert hops.parse_contender("dedup") == ("dedup", None)
    assert hops.parse_contender("quix-dedup@5") == ("quix-dedup", 5.0)
    assert hops.parse_contender("kstreams-keyed-count@0.5") == ("kstreams-keyed-count", 0.5)
    for bad, why in (
        ("dedup@1", "only a peer"), ("quix-dedup@soon", "must be seconds"), ("quix-dedup@0", "(0, 60]"),
        ("flink@1", "unknown hop"),
    ):
        with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("]", r"\]")):
            hops.parse_contender(bad)


def test_a_named_interval_reaches_its_peer_and_its_transaction_line() -> None:
    options = hops.HopOptions()
    assert hops.contender_options("quix-dedup@5", options).quix_commit_interval_s == 5.0
    assert hops.contender_options("kstreams-dedup@1", options).kstreams_commit_interval_s == 1.0
    assert hops.contender_options("kstreams-dedup@1", options).quix_commit_interval_s == options.quix_commit_interval_s
    assert hops.describe_transaction("quix-keyed-count@5", options) == "a checkpoint every 5 s"
    assert hops.describe_transaction("kstreams-dedup", options).startswith("a commit every 0.1 s")


def test_a_peer_run_at_several_intervals_is_judged_at_its_best() -> None:
    report = Report(hops={
        "dedup": BacklogRun(1000, 0.1), "quix-dedup@5": BacklogRun(1000, 0.4), "quix-dedup@1": BacklogRun(1000, 0.2),
    })
    assert report.ratios()["dedup_vs_quix"] == pytest.approx(2.0)


def test_the_broker_is_warmed_until_the_copier_stops_speeding_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow_tools.bench.watch import BacklogRun

    def runs(rates: list[float]) -> list[float]:
        seen = iter(rates)
        monkeypatch.setattr(hops, "copier", lambda _options: BacklogRun(int(next(seen)), 1.0))
        return hops.warm_broker(hops.HopOptions())

    # A fresh broker: the copier doubles twice, then holds within 10%.
    assert runs([20_000, 45_000, 88_000, 92_000, 130_000]) == [20_000, 45_000, 88_000, 92_000]
    assert len(runs([1_000 * 2**n for n in range(20)])) == hops.WARM_MAX_RUNS
    assert hops.warm_broker(hops.HopOptions(warm_up_records=0)) == []
