"""One hop at a time on the same backlog: onceflow's dedup gate and compute worker, and what a
user would otherwise run for the same job (a Quix Streams exactly-once app) or could at best get
(a bare transactional copier). Each runs as its own process and is timed the same way: from its
consumer group's first commit until it has committed the whole backlog (``watch.py``)."""

from __future__ import annotations

import logging
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from onceflow.bench import workload
from onceflow.bench.watch import BacklogRun, GroupWatch, time_backlog
from onceflow.config import CommonSettings, repo_root
from onceflow.infra.topics import TopicSpec, delete_topics, ensure_topics
from onceflow.kafka import clients
from onceflow.kafka.inspect import consumed_everything
from onceflow.process import ServiceProcess, free_port, pipeline_service
from onceflow.redis_client import connect, delete_prefix

log = logging.getLogger(__name__)

QUIX_DIR = Path("bench") / "peers" / "quix"
PEER_INPUT, PEER_OUTPUT = "peer.input", "peer.output"
# The contenders of the hop table, by the job they do.
HOPS = ("copier", "dedup", "quix-dedup", "compute", "quix-keyed-count")


@dataclass(frozen=True)
class HopOptions:
    records: int = 200_000
    users: int = 1_000
    quix_commit_interval_s: float = 1.0
    log_dir: Path = Path(".")


@contextmanager
def _namespace(tag: str) -> Iterator[CommonSettings]:
    """A fresh topic prefix with every onceflow topic and the peers' two; deleted afterwards,
    with whatever the contender created under it (Quix's changelogs carry the prefix in their
    names, not at their start)."""
    prefix = f"bench{uuid.uuid4().hex[:6]}{tag}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix, specs=[TopicSpec(PEER_INPUT, 4), TopicSpec(PEER_OUTPUT, 4)])
    try:
        yield common
    finally:
        delete_topics(common.kafka_bootstrap, prefix=prefix)
        admin = clients.admin(common)
        leftovers = [name for name in admin.list_topics(timeout=30).topics if prefix in name]
        if leftovers:
            for future in admin.delete_topics(leftovers, request_timeout=30).values():
                future.result()
        delete_prefix(connect(common.redis_url), prefix)


def _run(process: ServiceProcess, watch: GroupWatch, total: int, finished: Callable[[], bool] = lambda: True) -> BacklogRun:
    process.start()
    try:
        return time_backlog(watch, total, process.alive, finished)
    finally:
        watch.close()
        if process.alive():
            process.terminate(60)


def _peer_records(options: HopOptions, keyed_by_record_id: bool) -> Iterator[tuple[bytes, bytes]]:
    for record in workload.records(options.records, options.users, "bench"):
        key = record.record_id if keyed_by_record_id else record.user
        yield key.encode(), workload.peer_json(record)


def copier(options: HopOptions) -> BacklogRun:
    with _namespace("copy") as common:
        workload.write_backlog(common, common.topic(PEER_INPUT), _peer_records(options, keyed_by_record_id=False))
        group = common.topic("copier")
        process = ServiceProcess(
            "copier", "onceflow.bench.copier", {}, options.log_dir, cwd=repo_root(),
            args=[common.topic(PEER_INPUT), common.topic(PEER_OUTPUT), group, group],
        )
        return _run(process, GroupWatch(common, group, common.topic(PEER_INPUT)), options.records)


def dedup(options: HopOptions) -> BacklogRun:
    from onceflow_dedup.config import DedupSettings

    with _namespace("dedup") as common:
        workload.write_backlog(
            common, common.topic("ingest.records"),
            ((r.record_id.encode(), workload.envelope(r)) for r in workload.records(options.records, options.users, "bench")),
        )
        group = DedupSettings(common=common).group_id
        process = pipeline_service("dedup", f"127.0.0.1:{free_port()}", common.topic_prefix, "bench", options.log_dir)
        return _run(process, GroupWatch(common, group, common.topic("ingest.records")), options.records)


def compute(options: HopOptions) -> BacklogRun:
    """Both of compute's hops (map, then the keyed merge): done when the merge hop has consumed
    every partial the map hop wrote."""
    from onceflow_compute.config import ComputeSettings

    with _namespace("compute") as common:
        workload.write_backlog(
            common, common.topic("dedup.records"),
            ((r.user.encode(), workload.envelope(r)) for r in workload.records(options.records, options.users, "bench")),
        )
        settings = ComputeSettings(common=common)
        merge_group = settings.group_id(workload.JOB, "merge")
        process = pipeline_service(
            "compute", f"127.0.0.1:{free_port()}", common.topic_prefix, "bench", options.log_dir, JOB=workload.JOB
        )
        return _run(
            process, GroupWatch(common, settings.group_id(workload.JOB, "map"), common.topic("dedup.records")),
            options.records, lambda: consumed_everything(common, merge_group, common.topic("compute.partials")),
        )


def quix_python(root: Path | None = None) -> Path:
    """The Quix Streams peer's own venv (its pins clash with the workspace's), set up on demand."""
    folder = (root or repo_root()) / QUIX_DIR
    subprocess.run([str(folder / "setup.sh")], check=True)
    return folder / ".venv" / "bin" / "python"


def quix(options: HopOptions, app: str) -> BacklogRun:
    """A Quix Streams app (``apps.py``: ``dedup`` or ``keyed_count``), exactly-once, on the same
    records as JSON."""
    with _namespace(f"quix{app.replace('_', '')}") as common:
        workload.write_backlog(common, common.topic(PEER_INPUT), _peer_records(options, keyed_by_record_id=app == "dedup"))
        group = common.topic(f"quix-{app}")
        state_dir = options.log_dir / f"quix-state-{uuid.uuid4().hex[:6]}"
        process = ServiceProcess(
            f"quix-{app}", "apps", {}, options.log_dir, cwd=repo_root() / QUIX_DIR,
            args=[app, "--bootstrap", common.kafka_bootstrap, "--input", common.topic(PEER_INPUT),
                  "--output", common.topic(PEER_OUTPUT), "--group", group,
                  "--commit-interval", str(options.quix_commit_interval_s), "--state-dir", str(state_dir), "--quiet"],
            python=str(quix_python()),
        )
        return _run(process, GroupWatch(common, group, common.topic(PEER_INPUT)), options.records)


def run_hop(name: str, options: HopOptions) -> BacklogRun:
    runners: dict[str, Callable[[HopOptions], BacklogRun]] = {
        "copier": copier, "dedup": dedup, "compute": compute,
        "quix-dedup": lambda o: quix(o, "dedup"), "quix-keyed-count": lambda o: quix(o, "keyed_count"),
    }
    return runners[name](options)

