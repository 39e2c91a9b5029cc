#!/bin/sh
# The apache/kafka image's script of this name, which docker-compose.yml's health check runs.
exec java -Xmx128m -XX:TieredStopAtLevel=1 -Xshare:auto -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.xml \
    -cp "/opt/kafka/libs/*" org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
