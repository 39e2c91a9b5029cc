# Sourced by the install scripts: fetch one module zip from the Go module proxy and check it
# against a pinned go.sum hash, as the go command would, without needing go itself.
#
#   gomodule_fetch MODULE VERSION H1SUM OUT.zip

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
