"""What `onceflow verify --sink kafka` judges a Kafka output topic by (docs/services/sink.md,
"A Kafka output topic"): the topic read read_committed and folded by key (a tombstone deletes
the row) must equal the job's table; and no change of compute.results may be in it twice, which
each record's `onceflow-results` header (`<partition>/<offset>` of the change it came from)
shows. Read read_uncommitted, the same topic holds aborted transactions' writes too: a run with
a kill inside a transaction shows duplicates there, the proof that the check can see them."""

from __future__ import annotations

import json
from collections import Counter

from onceflow.config import CommonSettings
from onceflow.kafka.inspect import TopicRecord, consumed_everything, read_committed, read_uncommitted
from onceflow.topology import Topic
from onceflow_sink.kafka_output import HEADER, group_id
from onceflow_sink.kafka_output_config import KafkaOutputSettings
from onceflow_tools.verify.check import Verdict
from onceflow_tools.workloads import ResultTable


def _common(where: str | CommonSettings) -> CommonSettings:
    """A bootstrap (another cluster, reached with the environment's security settings) or the
    settings of the cluster to read."""
    return where if isinstance(where, CommonSettings) else CommonSettings().model_copy(update={"kafka_bootstrap": where})


def _records(where: str | CommonSettings, topic: str, committed: bool) -> list[TopicRecord]:
    read = read_committed if committed else read_uncommitted
    return read(_common(where), topic)


def fold(records: list[TopicRecord]) -> dict[str, bytes]:
    """row key -> its last value, in each partition's order; a tombstone deletes the row (a key
    lives in one partition: the producer places it by key)."""
    table: dict[str, bytes] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        if record.key is None:
            continue
        key = record.key.decode()
        if record.value is None:
            table.pop(key, None)
        else:
            table[key] = record.value
    return table


def output_table(where: str | CommonSettings, topic: str) -> dict[str, bytes]:
    """The output topic as the table a read_committed consumer builds from it."""
    return fold(_records(where, topic, committed=True))


def duplicate_changes(where: str | CommonSettings, topic: str, committed: bool = True) -> list[str]:
    """The `onceflow-results` header values (changes of compute.results) written more than once,
    sorted; ``committed=False`` reads aborted writes too."""
    return repeated(_records(where, topic, committed))


def repeated(records: list[TopicRecord]) -> list[str]:
    """The header values seen more than once, in compute.results' order."""
    seen = Counter(value.decode() for r in records if (value := r.header(HEADER)) is not None)
    return sorted((change for change, count in seen.items() if count > 1), key=_order)


def _order(change: str) -> tuple[int, ...]:
    return tuple(int(part) for part in change.split("/"))


def kafka_output_behind(common: CommonSettings, job: str, topic: str) -> list[str]:
    """What the output sink (on the pipeline's cluster) has not yet read of compute.results
    ([] = it read to the end and committed it)."""
    settings = KafkaOutputSettings(common=common, job=job, topic=topic)
    group = group_id(settings)
    if consumed_everything(common, group, common.topic(Topic.COMPUTE_RESULTS)):
        return []
    return [f"{group} on {common.topic(Topic.COMPUTE_RESULTS)}"]


def check_output_topic(verdict: Verdict, common: CommonSettings, topic: str, batch_rows: ResultTable) -> None:
    """The output topic judged into ``verdict``: folded by key it must equal the batch answer,
    and no change of compute.results may be in it twice."""
    rows = {key: json.loads(value) for key, value in output_table(common, topic).items()}
    wrong = sorted({k for k in batch_rows if rows.get(k) != batch_rows[k]} | (set(rows) - set(batch_rows)))
    doubled = duplicate_changes(common, topic)
    verdict.output_topic_rows = len(rows)
    verdict.output_topic_matches_batch = not wrong and bool(batch_rows)
    verdict.output_duplicates = len(doubled)
    for name, values in (("output_rows_wrong", wrong), ("output_duplicates", doubled)):
        if values:
            verdict.examples[name] = values[:20]
