"""A readiness probe as light as a Python process can be: ``python -m onceflow.probe HOST:PORT``
exits 0 when the service's grpc.health.v1 answers SERVING.

Tilt runs one per service every 2 s while they start. ``onceflow health`` gives the same
answer, but it loads the whole CLI (1.5 s of CPU per call), which starved the services it
probes on two cores. This imports only grpc (plaintext; TLS probes use ``onceflow health``)."""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m onceflow.probe HOST:PORT", file=sys.stderr)
        return 2
    address = argv[0]
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.RpcError as exc:
            print(f"{address}: unreachable ({exc.code().name})")  # type: ignore[attr-defined]
            return 1
    print(f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
