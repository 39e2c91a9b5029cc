"""The recovery figure of bench/kafka_cluster.py, on completion times made by hand."""

from onceflow_tools.bench.recovery import recovery_s


def steady(from_s: float, to_s: float, per_s: int) -> list[float]:
    return [1000 * from_s + i * 1000 / per_s for i in range(int((to_s - from_s) * per_s))]


def test_no_dip_is_no_recovery_time() -> None:
    assert recovery_s(steady(0, 60, 100), fault_ms=20_000) == 0.0


def test_a_stall_counts_until_half_the_rate_holds_again() -> None:
    times = steady(0, 20, 100) + steady(32, 60, 100)  # nothing completes for 12 s
    assert recovery_s(times, fault_ms=20_000) == 12.0


def test_a_trickle_below_half_is_still_a_stall() -> None:
    times = steady(0, 20, 100) + steady(20, 30, 40) + steady(30, 60, 100)
    assert recovery_s(times, fault_ms=20_000) == 10.0


def test_one_good_second_is_not_a_recovery() -> None:
    times = steady(0, 20, 100) + steady(25, 26, 100) + steady(30, 60, 100)
    assert recovery_s(times, fault_ms=20_000) == 10.0


def test_never_back_or_nothing_before_is_none() -> None:
    assert recovery_s(steady(0, 20, 100) + steady(20, 60, 10), fault_ms=20_000) is None
    assert recovery_s(steady(30, 60, 100), fault_ms=20_000) is None
