"""`onceflow verify --sink` as users run it, on the real broker, Redis and PostgreSQL: the sink's
tables in PostgreSQL and the job's table in a Kafka output topic stay exact through kill -9s and
zombies of both sinks, a crashed and a rolled-back database and a broker restart; and a build
whose PostgreSQL apply skips the offset fence fails the same checker."""

from __future__ import annotations

import json

import pytest

from tests.conftest import COMPUTE_NOT_UNDER_TEST
from tests.test_verify import verify

pytestmark = [pytest.mark.sinks, pytest.mark.verify, pytest.mark.integration, pytest.mark.fault]


@pytest.mark.timeout(900)
def test_postgres_tables_and_a_kafka_output_topic_stay_exact_through_every_fault(infra: None) -> None:
    code, verdict = verify(
        "--sink", "postgres,kafka", "--workload", "keyed-count",
        "--faults", "postgres-kill,postgres-rollback,kill9,zombie,broker",
        # Seed 16 draws kill9 and zombie first: a zombie resumed while records still flow finds
        # itself fenced at once, where one resumed after the clients stopped idles 20 s.
        "--duration", "24s", "--rate", "150", "--fault-every", "4", "--seed", "16", "--settle", "120",
        timeout_s=900, compute=COMPUTE_NOT_UNDER_TEST,
    )
    assert verdict["ok"] and code == 0, json.dumps(verdict)
    injected = verdict["faults_injected"]
    assert all(injected.get(kind, 0) >= 1 for kind in ("postgres-kill", "postgres-rollback", "kill9", "zombie", "broker")), injected
    assert verdict["sink_matches_batch"] and verdict["sink_rows"] > 100, verdict
    assert verdict["output_topic_matches_batch"] and verdict["output_topic_rows"] == verdict["sink_rows"], verdict
    assert verdict["output_duplicates"] == 0 and verdict["undrained"] == [], verdict
    # The first kill -9 hit the PostgreSQL sink and the first zombie the Kafka output sink (the
    # services under test). A zombie resumed with nothing left to write stays idle and is
    # stopped (None); what it wrote is judged above. tests/test_kafka_output_sink.py pauses one
    # inside its transaction and sees it exit 3, fenced.
    assert verdict["zombie_exits"], verdict
    # A rollback of the database under a running sink always costs it a rebuild.
    assert verdict["redis_repairs"] > 0, verdict


# make test's sabotaged campaign (the Redis one, tests/test_verify.py, runs in make test-extended).
def test_a_build_whose_postgres_apply_skips_the_offset_fence_fails_verification(infra: None) -> None:
    """Without the continuity check, a database restored from an older backup is written on as
    if nothing happened: the rows changed after the backup stay as the backup left them."""
    code, verdict = verify(
        "--sink", "postgres", "--sabotage", "postgres_unchecked", "--workload", "keyed-count", "--users", "5000",
        "--faults", "postgres-rollback", "--duration", "20s", "--rate", "150", "--fault-every", "5", "--seed", "6",
        "--settle", "30", timeout_s=600, compute=COMPUTE_NOT_UNDER_TEST,
    )
    assert verdict["faults_injected"].get("postgres-rollback", 0) >= 1, verdict["faults_injected"]
    assert code == 1 and not verdict["ok"], verdict
    assert not verdict["sink_matches_batch"] and verdict["sink_rows_wrong"] > 0, verdict
    # Nothing else noticed: the gate and the pipeline's topics are exact; only the table is wrong.
    assert verdict["lost"] == verdict["duplicated"] == verdict["redis_repairs"] == 0, verdict
