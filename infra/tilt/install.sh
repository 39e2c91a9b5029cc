#!/usr/bin/env bash
# Installs a pinned Tilt into .tools/bin, built from source: the Go module proxy (Go code) and
# the npm registry (the web UI) are the only places this project can fetch Tilt from; there
# are no release downloads. Idempotent: when .tools/bin/tilt already is the pinned version,
# this only runs `tilt version` and exits. See docs/decisions/0004-tilt-from-source.md.
#
#   infra/tilt/install.sh            # or: make tilt
set -euo pipefail

# The Makefile's TILT_VERSION. v0.34.0 is the newest Tilt release the module proxy serves
# here; its go.mod asks for go 1.23.
TILT_VERSION="${TILT_VERSION:-0.34.0}"
# go.sum hash (h1:) of each vetted release's module zip. The checksum database behind the proxy
# has no record for Tilt, so it is skipped for this one module and this pin checked instead;
# every dependency is still verified against Tilt's own go.sum.
case "$TILT_VERSION" in
    0.34.0) TILT_SUM="h1:oJAAkIiV34TEdlNqjDWkKG29hsAln7Ao28F+RTEZN24=" ;;
    *) echo "install.sh: no checksum pinned for tilt $TILT_VERSION; add its h1: sum here" >&2; exit 1 ;;
esac
GO_MIN=1.23
# Fetched into .tools only when `go` on PATH is missing or older than GO_MIN.
GO_VERSION=1.24.13

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="$root/.tools"
tilt="$tools/bin/tilt"

# A built Tilt is kept per version in the user's cache too (like ~/.m2 for Kafka's jars), so a
# fresh clone, `make clean` or CI copies it instead of rebuilding for minutes.
cache="${ONCEFLOW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onceflow}/tilt/v$TILT_VERSION"

# Fast path: the build below stamps the version, as Tilt's release build does ("v0.34.0, built …").
is_pinned() { [[ -x "$1" ]] && [[ "$("$1" version 2>/dev/null)" == "v$TILT_VERSION, built "* ]]; }
# shellcheck source=../gomodule.sh
source "$root/infra/gomodule.sh"
gomodule_installed "$tilt" "$cache/tilt" is_pinned "tilt v$TILT_VERSION" && exit 0

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go_bin="$(gomodule_go "$GO_MIN" "$GO_VERSION" "h1:5sgfUhn9QCgVl4UYj32GrIYFHI3bi2UX55tNfupXwxc=" "$tools" "$tmp")"
export GOTOOLCHAIN=local   # build with exactly the go chosen above; never switch on our behalf
# Module and build caches stay the user's defaults (shared with other Go work; `make clean`
# keeps them, so a rebuild after it is warm).

# `go install …/cmd/tilt@vX` cannot be used: Tilt's go.mod has replace directives (which
# `go install pkg@version` refuses) and its web UI must be built into the source tree before
# compiling. So: fetch the module, check its hash, build from a writable copy of it.
export GONOSUMDB="github.com/tilt-dev/tilt${GONOSUMDB:+,$GONOSUMDB}"
info="$(cd "$tmp" && "$go_bin" mod download -json "github.com/tilt-dev/tilt@v$TILT_VERSION")"
field() { sed -n "s/^\t\"$1\": \"\(.*\)\",\?$/\1/p" <<<"$info"; }
if [[ "$(field Sum)" != "$TILT_SUM" ]]; then
    echo "install.sh: tilt v$TILT_VERSION has sum '$(field Sum)', expected '$TILT_SUM'" >&2
    exit 1
fi
src="$tools/src/tilt-$TILT_VERSION"
if [[ ! -f "$src/.copied" ]]; then
    rm -rf "$src" && mkdir -p "$tools/src"   # a fresh copy; a failed build resumes from here
    cp -r "$(field Dir)" "$src"
    chmod -R u+w "$src"          # the module cache is read-only
    rm -rf "$src/vendor"         # only modules.txt ships; it would force -mod=vendor
    touch "$src/.copied"
fi

# Tilt's `make build-js`: the UI's own pinned yarn (web/.yarn/releases) installs from the npm
# registry and builds; Go embeds the result (go:embed) from pkg/assets/build. The module zip
# has no built UI, and without one a version-stamped Tilt refuses to start.
if [[ ! -f "$src/pkg/assets/build/index.html" ]]; then
    command -v node >/dev/null || { echo "install.sh: building Tilt's web UI needs node" >&2; exit 1; }
    echo "install.sh: building Tilt's web UI (yarn install + build, a few minutes)" >&2
    yarn=(node "$src/web/$(sed -n 's/^yarnPath: //p' "$src/web/.yarnrc.yml")")
    (cd "$src/web" && export YARN_ENABLE_TELEMETRY=0 YARN_CHECKSUM_BEHAVIOR=throw &&
        "${yarn[@]}" install --immutable && CI=false "${yarn[@]}" build)
    cp -r "$src/web/build/." "$src/pkg/assets/build/"
fi

echo "install.sh: building tilt v$TILT_VERSION with $("$go_bin" env GOVERSION) (minutes on a cold cache)" >&2
mkdir -p "$tools/bin"
date="$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$(field Info)")"   # the release's tag time
# As Tilt's release build: osusergo, stripped, version and date stamped (which also makes
# Tilt serve the embedded UI rather than look for a dev server).
(cd "$src" && "$go_bin" build -mod=readonly -tags osusergo \
    -ldflags "-s -w -X main.version=$TILT_VERSION -X main.date=$date" -o "$tilt.new" ./cmd/tilt)
mv "$tilt.new" "$tilt"
mkdir -p "$cache" && cp "$tilt" "$cache/tilt.new" && mv "$cache/tilt.new" "$cache/tilt"
rm -rf "$src" && rmdir "$tools/src" 2>/dev/null || true   # its web/node_modules are large
"$tilt" version
