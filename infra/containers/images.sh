#!/usr/bin/env bash
# Builds the compose stack's images with podman, without a registry (`make images`): the Debian
# bases (base.sh), one image per Dockerfile target, the Kafka image from the pinned jars and the
# Redis image from Debian's package. Layers are cached, so a second run takes seconds.
#
#   infra/containers/images.sh                 # every image
#   infra/containers/images.sh sink            # one (an upgrade: docs/deploy.md)
#   ONCEFLOW_IMAGE_TAG=2 infra/containers/images.sh sink --release=2   # labelled onceflow.release=2
#
# Images are named ${ONCEFLOW_IMAGE_PREFIX:-onceflow}-<name>:${ONCEFLOW_IMAGE_TAG:-latest}, the names
# docker-compose.yml runs. Nothing is tagged until every requested image has built, so a failed
# run leaves the previous images in place, never half of a new set.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/.tools/containers/containers.conf}"
prefix="${ONCEFLOW_IMAGE_PREFIX:-onceflow}"
tag="${ONCEFLOW_IMAGE_TAG:-latest}"
SERVICES=(acker dedup compute sink ingest source tools)
ALL=(kafka redis "${SERVICES[@]}")

missing() { echo "images.sh: $1" >&2; exit 1; }
command -v podman >/dev/null || missing "podman not found: run infra/containers/install.sh (Debian's podman, runc, podman-compose, mmdebstrap)"
[[ -f "$CONTAINERS_CONF" ]] || missing "no engine settings at $CONTAINERS_CONF: run infra/containers/install.sh"
command -v mmdebstrap >/dev/null || missing "mmdebstrap not found: run infra/containers/install.sh"

# podman build's RUN steps do not take containers.conf's default ulimits (the engine's own
# defaults are refused here, as for containers): the same limits, passed explicitly.
extra=()
for limit in $(sed -nE 's/^[[:space:]]*"((nofile|nproc)=[0-9]+:[0-9]+)",?/\1/p' "$CONTAINERS_CONF"); do
    extra+=(--ulimit "$limit")
done
# A network whose TLS is inspected needs its own CA bundle (SSL_CERT_FILE names it): the RUN
# steps see it in place of the image's store, and no image keeps it.
if [[ -n "${SSL_CERT_FILE:-}" && -f "$SSL_CERT_FILE" ]]; then
    extra+=(--volume "$SSL_CERT_FILE:/etc/ssl/certs/ca-certificates.crt:ro")
fi
# Docker's format: OCI images drop HEALTHCHECK, which the services' readiness rests on.
extra+=(--format docker)
wanted=()
release=""
for arg in "$@"; do
    case "$arg" in
        --release=*) release="${arg#--release=}" ;;
        -*) extra+=("$arg") ;;
        *) [[ " ${ALL[*]} " == *" $arg "* ]] || missing "unknown image '$arg' (one of: ${ALL[*]})"; wanted+=("$arg") ;;
    esac
done
[[ ${#wanted[@]} -gt 0 ]] || wanted=("${ALL[@]}")
# The services' images carry it as the label onceflow.release (the Dockerfile's last instruction).
[[ -z "$release" ]] || extra+=(--build-arg "ONCEFLOW_RELEASE=$release")

# Everything the builds need is checked before the first one starts.
jars="$root/.onceflow/kafka/libs"
if [[ " ${wanted[*]} " == *" kafka "* ]] && [[ ! -f "$jars/.pom-sha256" ]]; then
    missing "Kafka's pinned jars are not assembled: run make kafka-jars"
fi
for base in py jre redis; do
    "$root/infra/containers/base.sh" "$base"
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
declare -A built
report=()
for name in "${wanted[@]}"; do
    start=$SECONDS
    case "$name" in
        kafka)
            # The context: the jars (checked against infra/kafka/jars.sha256 when assembled), the
            # entry point and the logging set-up; nothing else of the repository.
            ctx="$tmp/kafka"
            mkdir -p "$ctx/libs"
            cp -p "$jars"/*.jar "$ctx/libs/"
            cp -rp infra/containers/kafka/bin infra/containers/kafka/log4j2.xml "$ctx/"
            podman build --quiet --iidfile "$tmp/$name.iid" "${extra[@]}" --build-arg BASE=localhost/onceflow-base:jre \
                -f infra/containers/kafka/Containerfile "$ctx" >/dev/null ;;
        redis)
            podman build --quiet --iidfile "$tmp/$name.iid" "${extra[@]}" --build-arg BASE=localhost/onceflow-base:redis \
                -f infra/containers/redis/Containerfile infra/containers/redis >/dev/null ;;
        *)
            base=localhost/onceflow-base:py
            [[ "$name" == compute ]] && base=localhost/onceflow-base:jre  # Spark's JVM
            podman build --quiet --iidfile "$tmp/$name.iid" "${extra[@]}" --build-arg BASE="$base" \
                --target "$name" -f Dockerfile . >/dev/null ;;
    esac
    built[$name]="$(cat "$tmp/$name.iid")"
    report+=("$name $((SECONDS - start))")
done
for name in "${wanted[@]}"; do
    podman tag "${built[$name]}" "$prefix-$name:$tag"
done
for line in "${report[@]}"; do
    read -r name seconds <<<"$line"
    size="$(podman image inspect --format '{{.Size}}' "$prefix-$name:$tag" | awk '{printf "%.0f MB", $1/1e6}')"
    printf 'images.sh: %-32s %8s  built in %s s\n' "$prefix-$name:$tag" "$size" "$seconds"
done
