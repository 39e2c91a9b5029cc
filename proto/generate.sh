#!/usr/bin/env bash
# Generates the Python code for every wire contract into libs/onceflow/src/onceflow/v1/
# (git-ignored). Used by `make proto` and by the Dockerfile; needs grpcio-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-python3}"
out=libs/onceflow/src
rm -rf "$out/onceflow/v1"
mkdir -p "$out/onceflow/v1"
"$python" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" proto/onceflow/v1/*.proto
touch "$out/onceflow/v1/__init__.py"
