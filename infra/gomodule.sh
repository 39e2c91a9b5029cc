# Sourced by the install scripts: fetch one module zip from the Go module proxy and check it
# against a pinned go.sum hash, as the go command would, without needing go itself.
#
#   gomodule_fetch MODULE VERSION H1SUM OUT.zip
#   gomodule_installed, gomodule_go: below (the tools built from Go modules)

gomodule_proxy() {
    local proxy="${GOPROXY:-$(go env GOPROXY 2>/dev/null || true)}"   # go's own setting, if any
    proxy="${proxy:-https://proxy.golang.org,direct}"                  # else go's default
    proxy="${proxy%%[,|]*}"
    [[ "$proxy" == http* ]] || { echo "gomodule: first GOPROXY entry is not a URL: $proxy" >&2; return 1; }
    echo "$proxy"
}

# go.sum's h1: hash of a module zip (dirhash.Hash1 in golang.org/x/mod).
gomodule_h1() {
    python3 - "$1" <<'PY'
import base64, hashlib, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
lines = "".join(f"{hashlib.sha256(z.read(n)).hexdigest()}  {n}\n" for n in sorted(z.namelist()))
print("h1:" + base64.b64encode(hashlib.sha256(lines.encode()).digest()).decode())
PY
}

gomodule_fetch() {
    local module="$1" version="$2" sum="$3" out="$4" proxy got
    proxy="$(gomodule_proxy)" || return 1
    # Module paths here are lower case, so the proxy's case escaping (!x) is not needed.
    curl -fsSL --retry 3 -o "$out.part" "$proxy/$module/@v/$version.zip"
    got="$(gomodule_h1 "$out.part")"
    if [[ "$got" != "$sum" ]]; then
        rm -f "$out.part"
        echo "gomodule: $module@$version has sum $got, expected $sum" >&2
        return 1
    fi
    mv "$out.part" "$out"
}

# The tools built from Go modules (Tilt, Helm) share these two steps.
#
#   gomodule_installed BIN CACHED_BIN IS_PINNED LABEL
# 0 when BIN is the pinned build (IS_PINNED BIN), or was copied from the user's cache, where a
# built binary is kept per version (like ~/.m2 for Kafka's jars), so that a fresh clone,
# `make clean` or CI copies it instead of building for minutes; 1 when it must be built.
gomodule_installed() {
    local bin="$1" cached="$2" is_pinned="$3" label="$4"
    "$is_pinned" "$bin" && return 0
    "$is_pinned" "$cached" || return 1
    mkdir -p "$(dirname "$bin")"
    cp "$cached" "$bin.new" && mv "$bin.new" "$bin"
    echo "install.sh: $label from the cache ($(dirname "$cached"))" >&2
}

#   gomodule_go GO_MIN GO_VERSION LINUX_AMD64_SUM TOOLS TMP
# Prints the go to build with: go on PATH when it is GO_MIN or newer, else Go GO_VERSION in
# TOOLS/go-GO_VERSION, fetched once as the go command fetches a toolchain (module
# golang.org/toolchain), checked against its go.sum hash. The module proxy here serves only the
# linux-amd64 build; elsewhere, install go >= GO_MIN yourself.
gomodule_go() {
    local go_min="$1" go_version="$2" sum="$3" tools="$4" tmp="$5" have platform goroot mod
    if command -v go >/dev/null; then
        have="$(go env GOVERSION 2>/dev/null || true)"   # e.g. go1.26.8
        if [[ "$have" == go* ]] && [[ "$(printf '%s\n%s\n' "$go_min" "${have#go}" | sort -V | head -n1)" == "$go_min" ]]; then
            command -v go
            return 0
        fi
    fi
    platform="$(uname -s | tr '[:upper:]' '[:lower:]')-$(uname -m | sed 's/x86_64/amd64/')"
    if [[ "$platform" != linux-amd64 ]]; then
        echo "install.sh: needs go >= $go_min on PATH (no Go $go_version pinned for $platform)" >&2
        return 1
    fi
    goroot="$tools/go-$go_version"
    if [[ ! -x "$goroot/bin/go" ]]; then
        mod="v0.0.1-go$go_version.$platform"
        echo "install.sh: downloading Go $go_version ($platform) from the module proxy" >&2
        gomodule_fetch golang.org/toolchain "$mod" "$sum" "$tmp/go.zip" || return 1
        unzip -q "$tmp/go.zip" -d "$tmp/go"
        mkdir -p "$tools"
        rm -rf "$goroot"
        mv "$tmp/go/golang.org/toolchain@$mod" "$goroot"   # the zip nests it under module@version
    fi
    echo "$goroot/bin/go"
}
