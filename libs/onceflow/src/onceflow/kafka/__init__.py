"""Kafka clients configured the one way onceflow uses them."""
