#!/bin/sh
# The broker's entry point: writes server.properties from the KAFKA_* variables as the apache/kafka
# image reads them (KAFKA_NODE_ID -> node.id; "__" -> "-", "___" -> "_"), formats the KRaft
# storage on the first start, then runs the broker in the foreground.
set -eu
props=/opt/kafka/config/server.properties
: > "$props"
env | sort | while IFS='=' read -r name value; do
    case "$name" in
        KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_LOG4J_OPTS | KAFKA_GC_LOG_OPTS | KAFKA_JMX_OPTS) ;;
        KAFKA_*)
            key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' | sed 's/___/\x01/g; s/__/-/g; s/_/./g; s/\x01/_/g')
            printf '%s=%s\n' "$key" "$value" >> "$props" ;;
    esac
done
grep -q '^log\.dirs=' "$props" || echo "log.dirs=/var/lib/kafka/data" >> "$props"
logdir=$(sed -n 's/^log\.dirs=//p' "$props" | cut -d, -f1)

classpath="/opt/kafka/libs/*"
log="-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.xml"
if [ ! -f "$logdir/meta.properties" ]; then
    # Static voters (controller.quorum.voters) need no --standalone; a dynamic quorum does.
    standalone=--standalone
    grep -q '^controller\.quorum\.voters=' "$props" && standalone=""
    java "$log" -cp "$classpath" kafka.tools.StorageTool format $standalone \
        -t "${CLUSTER_ID:-$(java "$log" -cp "$classpath" kafka.tools.StorageTool random-uuid)}" -c "$props"
fi
# The heap and G1 flags of `onceflow infra up`'s broker (onceflow_tools/infra/kafka_jvm.py).
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m} \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true ${KAFKA_OPTS:-} "$log" \
    -cp "$classpath" kafka.Kafka "$props"
