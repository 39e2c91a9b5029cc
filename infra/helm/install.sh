#!/usr/bin/env bash
# Installs a pinned Helm 3 into .tools/bin, built from source like Tilt (infra/tilt/install.sh):
# the module comes from the Go module proxy, checked against a pinned go.sum hash, and is built
# with the Go toolchain as Helm's own `make build` does. There are no release downloads.
# Idempotent: when .tools/bin/helm already is the pinned version, this only runs
# `helm version` and exits. The chart it is for: deploy/helm/onceflow (docs/helm.md).
#
#   infra/helm/install.sh            # or: make helm
set -euo pipefail

# The Makefile's HELM_VERSION. v3.22.0 is the newest Helm 3 the module proxy serves here; its
# go.mod asks for go 1.26.
HELM_VERSION="${HELM_VERSION:-3.22.0}"
# go.sum hash (h1:) of each vetted release's module zip. The checksum database cannot be reached
# from here, so it is skipped for this one module and this pin checked instead; every dependency
# is still verified against Helm's own go.sum (-mod=readonly).
case "$HELM_VERSION" in
    3.22.0) HELM_SUM="h1:n1if5iQgHYsujPAcO5oonH/KiSNUmqmUF0iGVjSF3AU=" ;;
    *) echo "install.sh: no checksum pinned for helm $HELM_VERSION; add its h1: sum here" >&2; exit 1 ;;
esac
GO_MIN=1.26
# Fetched into .tools only when `go` on PATH is missing or older than GO_MIN.
GO_VERSION=1.26.11

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="$root/.tools"
helm="$tools/bin/helm"

# A built Helm is kept per version in the user's cache too, so a fresh clone, `make clean` or CI
# copies it instead of building for minutes.
cache="${ONCEFLOW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onceflow}/helm/v$HELM_VERSION"

# Fast path: the build below stamps the version, as Helm's release build does.
is_pinned() { [[ -x "$1" ]] && [[ "$("$1" version --template '{{.Version}}' 2>/dev/null)" == "v$HELM_VERSION" ]]; }
# shellcheck source=../gomodule.sh
source "$root/infra/gomodule.sh"
gomodule_installed "$helm" "$cache/helm" is_pinned "helm v$HELM_VERSION" && exit 0

tmp="$(mktemp -d)"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
go_bin="$(gomodule_go "$GO_MIN" "$GO_VERSION" "h1:KyINmJ/FQdKRmDYGuTAAXkumyeR2DyUlSNHZj7XaLFg=" "$tools" "$tmp")"
export GOTOOLCHAIN=local   # build with exactly the go chosen above; never switch on our behalf
# Module and build caches stay the user's defaults (shared with other Go work; `make clean`
# keeps them, so a rebuild after it is warm).

export GONOSUMDB="helm.sh/helm/v3${GONOSUMDB:+,$GONOSUMDB}"
info="$(cd "$tmp" && "$go_bin" mod download -json "helm.sh/helm/v3@v$HELM_VERSION")"
field() { sed -n "s/^\t\"$1\": \"\(.*\)\",\?$/\1/p" <<<"$info"; }
if [[ "$(field Sum)" != "$HELM_SUM" ]]; then
    echo "install.sh: helm v$HELM_VERSION has sum '$(field Sum)', expected '$HELM_SUM'" >&2
    exit 1
fi
# Built as the main module from a copy of the module (the module cache is read-only), so that
# its go.mod and go.sum pin every dependency.
src="$tmp/helm"
cp -r "$(field Dir)" "$src"
chmod -R u+w "$src"

# As Helm's Makefile for a release tag: static, trimmed, stripped, the version stamped, and the
# Kubernetes version its lint and template assume taken from its client-go (v0.X.Y: 1.X).
k8s="$(cd "$src" && "$go_bin" list -mod=readonly -f '{{.Version}}' -m k8s.io/client-go)"
k8s="${k8s#v}"
k8s_major=$(( ${k8s%%.*} + 1 ))
k8s_minor="$(cut -d. -f2 <<<"$k8s")"
ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=$k8s_major -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$k8s_minor"
done

echo "install.sh: building helm v$HELM_VERSION with $("$go_bin" env GOVERSION) (minutes on a cold cache)" >&2
mkdir -p "$tools/bin"
(cd "$src" && CGO_ENABLED=0 "$go_bin" build -mod=readonly -buildvcs=false -trimpath -ldflags "$ldflags" \
    -o "$helm.new" ./cmd/helm)
mv "$helm.new" "$helm"
mkdir -p "$cache" && cp "$helm" "$cache/helm.new" && mv "$cache/helm.new" "$cache/helm"
"$helm" version
