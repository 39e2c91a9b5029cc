#!/usr/bin/env bash
# Build the Kafka Streams peer (target/onceflow-kstreams-peer.jar and target/lib/) with Maven,
# only when pom.xml or the sources changed since the last build (idempotent; Maven's own cache
# makes a rebuild cheap). Usage: setup.sh [MVN]   (default: mvn on PATH)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mvn="${1:-mvn}"
stamp="$here/target/.build-sha256"
jar="$here/target/onceflow-kstreams-peer.jar"
hash="$(cd "$here" && find pom.xml src -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [[ -f "$jar" && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]]; then
  exit 0
fi
# A changed pom can drop a jar: start from an empty target/lib.
rm -rf "$here/target/lib" "$stamp"
"$mvn" -q -B -f "$here/pom.xml" -DskipTests package
echo "$hash" > "$stamp"
