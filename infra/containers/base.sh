#!/usr/bin/env bash
# Builds a Debian base image without a registry: a root filesystem from Debian's packages by
# mmdebstrap, imported into podman's store. Idempotent: an image already there is kept
# (ONCEFLOW_REBUILD_BASES=1 rebuilds it).
#
#   infra/containers/base.sh py      # localhost/onceflow-base:py    python3.11 with venv support
#   infra/containers/base.sh jre     # localhost/onceflow-base:jre   the same and a headless JRE 17
#   infra/containers/base.sh redis   # localhost/onceflow-base:redis Debian's redis-server
#
# The release is pinned (bookworm: python3.11 and openjdk-17 are its versions); packages come
# from the mirror the machine's own apt configuration names, never one written here.
set -euo pipefail

SUITE=bookworm
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/.tools/containers/containers.conf}"
flavour="${1:?usage: base.sh py|jre|redis}"
case "$flavour" in
    py) packages=python3.11,python3-venv,ca-certificates ;;
    jre) packages=python3.11,python3-venv,ca-certificates,openjdk-17-jre-headless ;;
    redis) packages=redis-server ;;
    *) echo "base.sh: unknown base '$flavour' (py, jre or redis)" >&2; exit 2 ;;
esac
image="localhost/onceflow-base:$flavour"

for tool in podman mmdebstrap; do
    command -v "$tool" >/dev/null || { echo "base.sh: $tool not found: run infra/containers/install.sh" >&2; exit 1; }
done
if [[ -z "${ONCEFLOW_REBUILD_BASES:-}" ]] && podman image exists "$image"; then
    exit 0
fi

# The Debian mirror (and security mirror) of the machine's apt sources, for the pinned suite.
sources=()
for file in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$file" ]] || continue
    while read -r uri; do
        case "$uri" in
            */debian-security) sources+=("deb $uri $SUITE-security main") ;;
            */debian) sources+=("deb $uri $SUITE main" "deb $uri $SUITE-updates main") ;;
        esac
    done < <(sed -nE 's/^URIs:[[:space:]]*//p; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/p' "$file" | tr ' ' '\n' | sed 's:/*$::' | sort -u)
done
[[ ${#sources[@]} -gt 0 ]] || echo "base.sh: no Debian mirror in the machine's apt sources; mmdebstrap's default is used" >&2

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
# minbase, no recommends, no documentation or translations, no apt lists or caches: the
# excludes stay in the image (/etc/dpkg/dpkg.cfg.d), so packages installed later are lean too.
# The JRE's postinst links its man page and fails without man1 (Debian #863199), hence the mkdir.
mmdebstrap --quiet --variant=minbase --include="$packages" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --essential-hook='mkdir -p "$1"/usr/share/man/man1' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log' \
    "$SUITE" "$tmp/rootfs.tar" "${sources[@]}" </dev/null
podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    "$tmp/rootfs.tar" "$image" >/dev/null
echo "base.sh: $image built in $((SECONDS - start)) s ($(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
