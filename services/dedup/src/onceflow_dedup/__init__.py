"""onceflow dedup gate (in progress: the pure Bloom-bucket core only)."""
