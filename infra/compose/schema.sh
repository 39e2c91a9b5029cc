#!/usr/bin/env bash
# Fetches the Compose Specification's JSON schema into .tools/compose-spec/ for the tests that
# validate docker-compose.yml (no Docker engine runs on our machines). The schema ships in
# compose-go, the library Docker Compose itself loads files with, so it comes from the Go module
# proxy: a pinned version, checked against its pinned go.sum hash. Idempotent.
#
#   infra/compose/schema.sh        # prints the schema's path
set -euo pipefail

COMPOSE_GO_VERSION=v2.16.2
COMPOSE_GO_SUM="h1:pTp1DqQwJzFd85GzlWsSszKA1ABrV/ySqsClujIcWA8="

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="$root/.tools/compose-spec/compose-spec-$COMPOSE_GO_VERSION.json"
if [[ ! -s "$dest" ]]; then
    # shellcheck source=../gomodule.sh
    source "$root/infra/gomodule.sh"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    module=github.com/compose-spec/compose-go/v2
    gomodule_fetch "$module" "$COMPOSE_GO_VERSION" "$COMPOSE_GO_SUM" "$tmp/module.zip"
    mkdir -p "$(dirname "$dest")"
    unzip -p "$tmp/module.zip" "$module@$COMPOSE_GO_VERSION/schema/compose-spec.json" > "$dest.part"
    mv "$dest.part" "$dest"
fi
echo "$dest"
