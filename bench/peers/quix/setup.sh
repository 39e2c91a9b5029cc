#!/usr/bin/env bash
# Create/sync the Quix Streams peer venv at bench/peers/quix/.venv (idempotent).
# Usage: setup.sh [UV]   (default UV: the repo's pinned uv, ../../../.tools/uv-venv/bin/uv)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
uv="${1:-$here/../../../.tools/uv-venv/bin/uv}"
# Keep uv from reusing an activated venv of the workspace.
unset VIRTUAL_ENV
exec "$uv" sync --quiet --locked --project "$here"
