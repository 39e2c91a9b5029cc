"""A readiness probe as light as a Python process can be: ``python -m onceflow.probe HOST:PORT``
exits 0 when the service's grpc.health.v1 answers SERVING.

Tilt runs one per service every 2 s while they start. ``onceflow health`` gives the same
answer, but it loads the whole CLI (1.5 s of CPU per call), which starved the services it
probes on two cores. This imports only grpc (plaintext; TLS probes use ``onceflow health``)."""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2

# The method as grpc_health's HealthStub calls it. Called through the channel, not the stub:
# the stub's typing (types-grpcio-health-checking) declares none of its methods.
_CHECK = "/grpc.health.v1.Health/Check"


def check_health(channel: grpc.Channel, timeout_s: float) -> health_pb2.HealthCheckResponse:
    """grpc.health.v1 Check of the whole server (raises grpc.RpcError)."""
    check = channel.unary_unary(
        _CHECK,
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    return check(health_pb2.HealthCheckRequest(), timeout=timeout_s)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m onceflow.probe HOST:PORT", file=sys.stderr)
        return 2
    address = argv[0]
    with grpc.insecure_channel(address) as channel:
        try:
            reply = check_health(channel, timeout_s=2.0)
        except grpc.RpcError as exc:
            print(f"{address}: unreachable ({exc.code().name})")
            return 1
    print(f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
