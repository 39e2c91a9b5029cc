"""A topic's id (KIP-516): the UUID the cluster gives a topic when it is created, so a topic
deleted and created again under its name is told apart from the old one by its id."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

# What a broker without topic ids (before Kafka 2.8) reports, as Kafka prints it.
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
_UNSUPPORTED = {KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION}


def read_topic_id(admin: AdminClient, topic: str, timeout_s: float = 15.0) -> str:
    """``topic``'s id in Kafka's own text form (22 characters of URL-safe base64, as
    kafka-topics.sh --describe prints it), or "" if the cluster has none to give (an old broker).
    Raises KafkaException when the topic does not exist or the cluster does not answer."""
    try:
        description = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() in _UNSUPPORTED:
            return ""
        raise
    topic_id = str(description.topic_id) if description.topic_id is not None else ""
    return "" if topic_id == NO_TOPIC_ID else topic_id
