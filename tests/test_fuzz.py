"""`make fuzz` (issue 39; not in `make test`): every gRPC boundary of a running pipeline under
hypothesis-generated requests, structured from the protos (tests/harness/proto_strategies.py),
and as raw bytes; and the Kafka source's mapping under arbitrary records.

Each call must end in a precise status: OK, or a refusal that names what is wrong
(INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE, RESOURCE_EXHAUSTED,
UNAUTHENTICATED, PERMISSION_DENIED), never UNKNOWN, INTERNAL or UNIMPLEMENTED, never a client-side
deadline (a stalled service). Afterwards every service is alive and answers health within a
second, and no service's resident memory grew past a bound. The counts per method and status
are printed (pytest -s) and written to the run's log directory.

ONCEFLOW_FUZZ_EXAMPLES sets the examples per boundary (default 300)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.spout import Limits
from onceflow.v1 import acker_pb2, admin_pb2, compute_pb2, dedup_pb2, ingest_pb2, jobs_pb2, sink_pb2
from onceflow_source.mapping import Mapping, SourceRecord, Unmappable, map_record
from onceflow_tools.verify.supervisor import Supervisor
from tests.conftest import COMPUTE_NOT_UNDER_TEST
from tests.harness.proto_strategies import messages
from tests.harness.supervised import supervised

pytestmark = [pytest.mark.fuzz, pytest.mark.integration, pytest.mark.xdist_group("fuzz")]

EXAMPLES = int(os.environ.get("ONCEFLOW_FUZZ_EXAMPLES", "300"))
PRECISE = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}
CALL_TIMEOUT_S = 30.0
RSS_GROWTH_MB = 200  # per service, from after the first round to the end
# Which service serves which gRPC service (Admin: every one).
SERVED_BY = {
    "onceflow.v1.Ingest": ["ingest"], "onceflow.v1.Query": ["sink"], "onceflow.v1.JobAdmin": ["sink"],
    "onceflow.v1.DedupAdmin": ["dedup"], "onceflow.v1.AckerAdmin": ["acker"], "onceflow.v1.ComputeAdmin": ["compute"],
    "onceflow.v1.Admin": ["ingest", "dedup", "acker", "compute", "sink"],
}
MODULES = (acker_pb2, admin_pb2, compute_pb2, dedup_pb2, ingest_pb2, jobs_pb2, sink_pb2)
METHODS: list[MethodDescriptor] = [
    method for module in MODULES for service in module.DESCRIPTOR.services_by_name.values() for method in service.methods
]
# Metadata a caller may send: none, junk tokens, oversized and odd values.
METADATA = st.one_of(
    st.just(()),
    st.tuples(st.tuples(st.just("authorization"), st.sampled_from(["Bearer ", "Bearer x", "bearer nope", "Basic Zm9v", "x" * 3000]))),
    st.tuples(st.tuples(st.sampled_from(["x-onceflow", "grpc-timeout-ish", "authorization-x"]), st.text(
        st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=200))),
)


class Outcomes:
    """Status counts per method, and the calls that ended imprecisely."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.imprecise: list[str] = []

    def record(self, method: str, code: grpc.StatusCode, details: str, request: object) -> None:
        self.counts[(method, code.name)] += 1
        if code not in PRECISE:
            self.imprecise.append(f"{method}: {code.name} {details[:300]!r} for {str(request)[:300]!r}")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def pipeline(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    # A processed wait is bounded by the tree timeout; short, so one never outlasts a call.
    env = {"ONCEFLOW_INGEST_TREE_TIMEOUT_MS": "10000", **COMPUTE_NOT_UNDER_TEST}
    yield from supervised(tmp_path_factory.mktemp("fuzz"), {}, env)


def _call(channel: grpc.Channel, method: MethodDescriptor) -> Callable[..., object]:
    path = f"/{method.containing_service.full_name}/{method.name}"
    reply = GetMessageClass(method.output_type).FromString
    if method.client_streaming:
        return channel.stream_unary(path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=reply)
    return channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=reply)


def _raw(channel: grpc.Channel, method: MethodDescriptor) -> Callable[..., object]:
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.client_streaming:
        return channel.stream_unary(path)
    return channel.unary_unary(path)


@pytest.mark.timeout(3600)  # FUZZ_EXAMPLES scales it: 300 per boundary is about 5 minutes
def test_every_boundary_answers_precisely_stays_up_and_bounded(pipeline: Supervisor, tmp_path: Path) -> None:
    outcomes = Outcomes()
    channels = {name: grpc.insecure_channel(pipeline.address(name)) for name in SERVED_BY["onceflow.v1.Admin"]}
    targets = [(name, method) for method in METHODS for name in SERVED_BY[method.containing_service.full_name]]
    pids = {name: pipeline.instances[name].process.pid for name in channels}
    started = {name: rss_mb(pid) for name, pid in pids.items()}

    def one(name: str, method: MethodDescriptor, request: object, metadata: tuple, raw: bool) -> None:
        call = (_raw if raw else _call)(channels[name], method)
        argument = iter([request] * 3) if method.client_streaming else request
        try:
            call(argument, timeout=CALL_TIMEOUT_S, metadata=metadata)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and "outcome unknown" in details:
                code = grpc.StatusCode.OK  # ingest's own answer to a processed wait past the tree timeout
        outcomes.record(f"{name} {method.containing_service.name}/{method.name}{' (raw)' if raw else ''}", code, details, request)

    def fuzz(name: str, method: MethodDescriptor) -> None:
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(request=messages(method.input_type), metadata=METADATA)
        def structured(request: object, metadata: tuple) -> None:
            one(name, method, request, metadata, raw=False)

        @settings(max_examples=max(EXAMPLES // 3, 10), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(raw=st.binary(max_size=2000))
        def raw_bytes(raw: bytes) -> None:
            one(name, method, raw, (), raw=True)

        structured()
        raw_bytes()

    for name, method in targets:
        fuzz(name, method)
        for service in pids:
            assert pipeline.instances[service].process.alive(), f"{service} died under {method.full_name}"

    ended = {name: rss_mb(pid) for name, pid in pids.items()}
    report = {
        "examples_per_boundary": EXAMPLES,
        "calls": sum(outcomes.counts.values()),
        "by_method_and_status": {f"{m} {c}": n for (m, c), n in sorted(outcomes.counts.items())},
        "rss_mb": {name: [round(started[name]), round(ended[name])] for name in pids},
        "imprecise": outcomes.imprecise[:50],
    }
    log_dir = Path(os.environ.get("ONCEFLOW_FUZZ_REPORT_DIR", str(tmp_path)))
    (log_dir / "fuzz-report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "by_method_and_status"}, indent=1))
    for key, count in report["by_method_and_status"].items():
        print(f"{count:7d}  {key}")
    assert not outcomes.imprecise, "\n".join(outcomes.imprecise[:20])
    for name in pids:
        stub = health_pb2_grpc.HealthStub(channels[name])
        answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, name
        assert ended[name] - started[name] < RSS_GROWTH_MB, f"{name}: {started[name]:.0f} -> {ended[name]:.0f} MB"


@settings(max_examples=EXAMPLES * 10, deadline=None, database=None)
@given(
    value=st.one_of(st.none(), st.binary(max_size=3000), st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
        st.text(max_size=10), st.one_of(st.none(), st.integers(), st.text(max_size=30), st.floats(allow_nan=False)), max_size=6))),
    key=st.one_of(st.none(), st.binary(max_size=6000)),
    headers=st.lists(st.tuples(st.text(max_size=30), st.one_of(st.none(), st.binary(max_size=200))), max_size=8),
    id_field=st.sampled_from(["", "id", "a.b", "missing"]),
    timestamp=st.integers(-(2**63), 2**63 - 1),
)
def test_the_source_mapping_maps_or_refuses_every_record(
    value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes | None]], id_field: str, timestamp: int,
) -> None:
    """No record of a user's topic makes the mapping raise anything but Unmappable (a letter)."""
    record = SourceRecord(topic="orders", partition=0, offset=7, key=key, value=value, headers=headers, timestamp_ms=timestamp)
    try:
        mapped = map_record(record, Mapping(Limits(4096, 1024), id_field=id_field))
    except Unmappable:
        return
    assert mapped.record_id and len(mapped.record_id) <= 256
