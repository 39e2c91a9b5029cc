"""Quix Streams peer apps for ``onceflow bench``.

The same single-hop jobs the onceflow services do (a keyed count/sum and a
dedup gate), written the way a Quix Streams 3.28 user would, so the benchmark
can run them side by side with onceflow on the same Kafka broker under
``processing_guarantee="exactly-once"``. It lives in its own uv project
(bench/peers/quix) because quixstreams pins confluent-kafka below the version
the onceflow workspace uses.

    python apps.py {keyed_count,dedup} --bootstrap HOST:PORT --input TOPIC \
        --output TOPIC --group GROUP [--commit-interval 1.0] [--state-dir DIR] \
        [--exactly-once | --at-least-once]

Input: key = user (keyed_count) or record_id (dedup) as bytes, value = JSON
``{"record_id", "user", "amount", "ingest_time_ms"}``. Runs until SIGTERM or
SIGINT, which Quix turns into a graceful stop (last checkpoint committed).
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import authlib.deprecate  # noqa: F401  (installs an "always" filter; ours goes in front)

# authlib (pulled in by quixstreams) warns about httpx on import; keep stderr clean.
warnings.filterwarnings("ignore", message=r"The httpx module is deprecated")

from quixstreams import Application, State  # noqa: E402
from quixstreams.dataframe import StreamingDataFrame  # noqa: E402


def count_and_sum(value: dict[str, Any], state: State) -> dict[str, Any]:
    """Fold one record into the per-user (count, sum) kept in Quix state."""
    count = state.get("count", 0) + 1
    total = state.get("sum", 0) + int(value["amount"])
    state.set("count", count)
    state.set("sum", total)
    return {"user": value["user"], "count": count, "sum": total}


def first_sighting(_value: bytes, state: State) -> bool:
    """Keep a record only the first time its key (the record_id) is seen."""
    if state.exists("seen"):
        return False
    state.set("seen", True)
    return True


def build(args: argparse.Namespace) -> Application:
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        processing_guarantee="exactly-once" if args.exactly_once else "at-least-once",
        auto_offset_reset="earliest",
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
        # The bench pre-creates input/output (4 partitions); this only creates
        # what is missing, i.e. Quix's changelog topic.
        auto_create_topics=True,
        loglevel="WARNING" if args.quiet else "INFO",
    )
    sdf: StreamingDataFrame
    if args.job == "keyed_count":
        src = app.topic(args.input, key_deserializer="str", value_deserializer="json")
        dst = app.topic(args.output, key_serializer="str", value_serializer="json")
        sdf = app.dataframe(src).apply(count_and_sum, stateful=True)
    else:
        # The dedup gate never looks inside the value: pass its bytes through as is.
        src = app.topic(args.input, key_deserializer="str", value_deserializer="bytes")
        dst = app.topic(args.output, key_serializer="str", value_serializer="bytes")
        sdf = app.dataframe(src).filter(first_sighting, stateful=True)
    sdf.to_topic(dst)  # the key stays the input key (user / record_id)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job", choices=["keyed_count", "dedup"])
    p.add_argument("--bootstrap", required=True, help="Kafka HOST:PORT")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--group", required=True, help="consumer group (also names the changelog)")
    p.add_argument("--commit-interval", type=float, default=1.0, help="checkpoint period, seconds")
    p.add_argument("--state-dir", default="state", help="RocksDB state directory")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--exactly-once", dest="exactly_once", action="store_true", default=True)
    g.add_argument("--at-least-once", dest="exactly_once", action="store_false")
    p.add_argument("--quiet", action="store_true", help="log WARNING and above only")
    args = p.parse_args(argv)
    build(args).run()


if __name__ == "__main__":
    main()
