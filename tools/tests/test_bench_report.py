"""The bench's arithmetic: the ratios its targets are stated in and the latency it reads off a
sweep must be the ones the numbers say (a bench that misreports is worse than none)."""

from __future__ import annotations

import json

import pytest

from onceflow_tools.bench.cpu import HopCpu
from onceflow_tools.bench.pipeline import ModeResult, RatePoint, completion_rate, percentile
from onceflow_tools.bench.report import Report, curves, write
from onceflow_tools.bench.watch import BacklogRun

pytestmark = pytest.mark.verify


def _report(eos: float, alos: float, p99_at_half: float) -> Report:
    sweep = [RatePoint(eos * f, eos * f, 100, 50.0, p99) for f, p99 in ((0.25, 100.0), (0.5, p99_at_half), (1.0, 5000.0))]
    return Report(
        modes={"exactly_once": ModeResult("exactly_once", eos, sweep=sweep), "at_least_once": ModeResult("at_least_once", alos, sweep=sweep)},
        hops={"copier": BacklogRun(1000, 0.1), "dedup": BacklogRun(1000, 0.2), "quix-dedup": BacklogRun(1000, 0.4),
              "compute": BacklogRun(1000, 0.5), "quix-keyed-count": BacklogRun(1000, 0.4)},
    )


def test_ratios_and_verdicts_follow_the_numbers() -> None:
    report = _report(eos=900, alos=1000, p99_at_half=450)
    ratios = report.ratios()
    assert ratios["exactly_once_vs_at_least_once"] == pytest.approx(0.9)
    assert ratios["dedup_vs_quix"] == pytest.approx(2.0)
    assert ratios["compute_vs_quix"] == pytest.approx(0.8)
    assert ratios["dedup_vs_copier"] == pytest.approx(0.5)
    assert report.p99_at_half_load() == 450
    assert report.verdicts() == {
        "exactly_once_vs_at_least_once": True, "dedup_vs_quix": True, "compute_vs_quix": False,
        "dedup_vs_copier": False, "compute_vs_copier": False, "p99_within_500ms_at_half_load": True,
    }


def test_the_half_load_p99_is_the_rows_visibility_when_the_step_had_probes() -> None:
    report = _report(eos=900, alos=1000, p99_at_half=450)
    half = report.modes["exactly_once"].sweep[1]
    half.visible_p99_ms, half.probes = 620.0, 40  # the completed p99 (450) would pass
    assert report.p99_at_half_load() == 620
    assert not report.verdicts()["p99_within_500ms_at_half_load"]


def test_the_pipeline_is_set_against_the_copier_chain_when_both_ran() -> None:
    report = _report(eos=900, alos=1000, p99_at_half=1500)
    assert "exactly_once_vs_copier_chain" not in report.ratios()
    report.hops["copier-chain"] = BacklogRun(3000, 1.0)
    assert report.ratios()["exactly_once_vs_copier_chain"] == pytest.approx(0.3)


def test_a_hop_is_bounded_by_its_busiest_thread_and_the_machine_against_the_copier() -> None:
    report = _report(eos=900, alos=1000, p99_at_half=1500)
    assert not any("cpu_bound" in name for name in report.ratios())
    # 50 µs per record on its busiest thread: at most 20,000/s; the copier ran 10,000/s.
    report.hops["dedup"] = BacklogRun(1000, 0.2, cpu=HopCpu(own_us=80, busiest_thread_us=50, broker_us=10, redis_us=2))
    report.hops["kstreams-dedup"] = BacklogRun(1000, 0.1, cpu=HopCpu(own_us=30, busiest_thread_us=None, broker_us=9, redis_us=0))
    report.cores = 2
    ratios = report.ratios()
    # Its thread allows 20,000/s; two cores at 80 + 10 + 2 µs a record, 21,739/s: the thread binds.
    assert ratios["dedup_cpu_bound_vs_copier"] == pytest.approx(2.0)
    # A JVM has no one thread to bound it: the machine does, 2 cores ÷ 39 µs = 51,282/s.
    assert ratios["kstreams-dedup_cpu_bound_vs_copier"] == pytest.approx(2e6 / 39 / 10_000)
    report.cores = 1
    assert report.ratios()["dedup_cpu_bound_vs_copier"] == pytest.approx(1e6 / 92 / 10_000)
    assert json.loads(json.dumps(report.as_json()))["hops"]["dedup"]["cpu"]["busiest_thread_us"] == 50


def test_a_slow_exactly_once_pipeline_misses_its_targets() -> None:
    verdicts = _report(eos=700, alos=1000, p99_at_half=2500).verdicts()
    assert not verdicts["exactly_once_vs_at_least_once"]
    assert not verdicts["p99_within_500ms_at_half_load"]


def testcompletion_rate_ignores_the_first_and_last_tenth() -> None:
    # 1,000 trees over 10 s at 100/s, then one straggler 100 s later: the rate stays 100/s.
    times = [1_000_000 + i * 10 for i in range(1000)] + [1_110_000]
    assert completion_rate(times) == pytest.approx(100, rel=0.02)


def testpercentiles() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7], 99) == 7


def test_the_report_writes_json_and_a_plot(tmp_path) -> None:
    data, png = write(_report(eos=900, alos=1000, p99_at_half=1500), tmp_path)
    written = json.loads(data.read_text())
    assert written["ratios"]["exactly_once_vs_at_least_once"] == pytest.approx(0.9)
    assert set(written["hops"]) == {"copier", "dedup", "quix-dedup", "compute", "quix-keyed-count"}
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_draws_each_mode_over_the_offered_rate_in_order() -> None:
    # A mode that falls behind: offered 3,000/s it achieves less than it did offered 2,000/s.
    # Drawn over the achieved rate its points would come out of order (and the line zig-zag).
    sweep = [
        RatePoint(3000, 1500, 100, 900.0, 4000.0, 950.0, 4200.0, probes=5),
        RatePoint(1000, 1000, 100, 100.0, 200.0, 150.0, 250.0, probes=5),
        RatePoint(2000, 1900, 100, 300.0, 600.0, 350.0, 650.0, probes=5),
    ]
    lines = {curve.label: curve for curve in curves(ModeResult("at_least_once", 1900, sweep=sweep))}
    assert set(lines) == {f"at_least_once {figure}" for figure in ("completed p99", "completed p50", "visible p99", "visible p50")}
    for curve in lines.values():
        assert curve.offered == [1000, 2000, 3000]
    assert lines["at_least_once completed p99"].ms == [200.0, 600.0, 4000.0]
    assert lines["at_least_once visible p50"].ms == [150.0, 350.0, 950.0]
    # Without probes there is nothing to draw for visibility.
    assert {c.label for c in curves(ModeResult("exactly_once", 900, sweep=[RatePoint(500, 500, 10, 1.0, 2.0)]))} == {
        "exactly_once completed p99", "exactly_once completed p50",
    }
