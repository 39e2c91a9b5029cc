"""The per-job templates of infra/topics.toml: named for a job with the template's partitions and
compaction, left out of the shared topics, and recognised when deleting (no broker)."""

from __future__ import annotations

from onceflow.kafka.topics import is_declared, job_specs, load_specs, shared_specs
from onceflow.topology import Topic, job_topic


def test_a_jobs_specs_follow_the_templates() -> None:
    specs = {s.name: s for s in job_specs("wordcount")}
    partials, changelog = job_topic(Topic.COMPUTE_PARTIALS, "wordcount"), job_topic(Topic.COMPUTE_CHANGELOG, "wordcount")
    assert set(specs) == {partials, changelog}
    assert specs[changelog].compacted and specs[changelog].partitions_of == partials
    assert specs[changelog].partitions == specs[partials].partitions == 4
    assert not specs[partials].compacted


def test_the_shared_topics_leave_the_templates_out() -> None:
    shared = {s.name for s in shared_specs()}
    assert shared == {str(t) for t in Topic if not t.per_job}
    assert len(shared) + len(job_specs("x")) == len(load_specs())


def test_a_jobs_topics_count_as_declared() -> None:
    specs = load_specs()
    assert is_declared("compute.partials.nexmark_q7", specs) and is_declared("compute.results", specs)
    assert not is_declared("compute.partials.", specs) and not is_declared("compute.partials.a.b", specs)
    assert not is_declared("__consumer_offsets", specs)
