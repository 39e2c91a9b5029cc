#!/usr/bin/env bash
# Installs the container engine the project's images and compose stack run on, from Debian's
# packages, and writes its settings. Idempotent; uses sudo only when not root.
#
#   infra/containers/install.sh     # then: make images && make compose-up
#
# The settings go to .tools/containers/containers.conf (from infra/containers/containers.conf),
# which `make images`, `make compose-*` and tests/test_deploy.py name through CONTAINERS_CONF:
# the machine's own /etc/containers is left as it was. By hand:
#   export CONTAINERS_CONF=$PWD/.tools/containers/containers.conf
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# runc (crun fails on hybrid cgroups); netavark and aardvark-dns resolve service names on a
# compose network; uidmap and slirp4netns are what podman needs without root.
# catatonit: the pause process of `podman kube play`'s pods (the Helm chart's pods test).
PACKAGES=(podman runc podman-compose mmdebstrap netavark aardvark-dns uidmap slirp4netns catatonit)

sudo=""
[[ "$(id -u)" -eq 0 ]] || sudo="sudo"
absent=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || absent+=("$pkg")
done
if [[ ${#absent[@]} -gt 0 ]]; then
    command -v apt-get >/dev/null || { echo "install.sh: needs Debian's apt-get for ${absent[*]}" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends "${absent[@]}" >/dev/null \
        || { $sudo apt-get update -qq && $sudo apt-get install -y --no-install-recommends "${absent[@]}" >/dev/null; }
fi

# The default ulimits, capped at this shell's hard limits: a container may not ask for more
# than its caller holds (runc's setrlimit is refused otherwise).
# (nproc: 65536 was refused in podman build's RUN steps on a host whose hard limit is higher.)
cap() { local hard; hard="$(ulimit -H "$1")"; [[ "$hard" == unlimited || "$hard" -gt "$2" ]] && hard="$2"; echo "$hard"; }
nofile="$(cap -n 65536)"
nproc="$(cap -u 32768)"
conf="$root/.tools/containers/containers.conf"
mkdir -p "$(dirname "$conf")"
sed -e "s/nofile=65536:65536/nofile=$nofile:$nofile/" -e "s/nproc=32768:32768/nproc=$nproc:$nproc/" \
    "$root/infra/containers/containers.conf" > "$conf.part"
mv "$conf.part" "$conf"

# Proof that it runs here, once the first base exists (make images builds it).
export CONTAINERS_CONF="$conf"
echo "install.sh: $(podman --version), runc $(runc --version | sed -n "s/^runc version //p"), podman-compose $(podman-compose --version 2>/dev/null | sed -n "s/^podman-compos.* version *//p"); settings in ${conf#"$root"/}"
