#!/usr/bin/env bash
# Generates the Python code for every wire contract into libs/onceflow-wire/src/onceflow/v1/
# (git-ignored but for its __init__.py). Used by `make proto` and by the Dockerfile; needs
# grpcio-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-python3}"
out=libs/onceflow-wire/src
find "$out/onceflow/v1" -maxdepth 1 -name '*_pb2*' -delete
"$python" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" proto/onceflow/v1/*.proto
