"""The benches' reading of the services' histograms: sums and counts per hop, and the
difference between two scrapes."""

from onceflow_tools.bench.histograms import difference, parse

EXPOSITION = """\
# HELP onceflow_batch_records Records per committed batch.
# TYPE onceflow_batch_records histogram
onceflow_batch_records_bucket{le="1.0",service="dedup"} 3.0
onceflow_batch_records_count{service="dedup"} 4.0
onceflow_batch_records_sum{service="dedup"} 1000.0
onceflow_batch_records_count{service="compute"} 2.0
onceflow_batch_records_sum{service="compute"} 50.0
onceflow_compute_job_seconds_count{engine="spark",job="usersum"} 5.0
onceflow_compute_job_seconds_sum{engine="spark",job="usersum"} 0.5
onceflow_commit_seconds_count{service="dedup"} 9.0
"""


def test_parse_keeps_the_named_histograms_per_hop() -> None:
    samples = parse(EXPOSITION, ("onceflow_batch_records", "onceflow_compute_job_seconds"))
    assert samples == {
        ("onceflow_batch_records", "dedup"): (1000.0, 4.0),
        ("onceflow_batch_records", "compute"): (50.0, 2.0),
        ("onceflow_compute_job_seconds", "usersum"): (0.5, 5.0),
    }


def test_parse_adds_up_a_hops_label_sets() -> None:
    text = 'onceflow_batch_records_count{partition="0",service="sink"} 2\nonceflow_batch_records_count{partition="1",service="sink"} 3\n'
    assert parse(text, ("onceflow_batch_records",)) == {("onceflow_batch_records", "sink"): (0.0, 5.0)}


def test_difference_leaves_out_idle_hops_and_names_reset_ones() -> None:
    before = {("h", "a"): (10.0, 2.0), ("h", "b"): (5.0, 1.0), ("h", "c"): (50.0, 9.0)}
    after = {("h", "a"): (30.0, 6.0), ("h", "b"): (5.0, 1.0), ("h", "c"): (1.0, 1.0), ("h", "d"): (2.0, 1.0)}
    delta, reset = difference(before, after)
    assert delta == {("h", "a"): (20.0, 4.0), ("h", "d"): (2.0, 1.0)}
    assert reset == ["c"]
