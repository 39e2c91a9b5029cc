"""The Dataflow model's pure core: where in event time (windows), when in processing time
(watermarks, triggers) and how refinements relate (accumulation, retractions), plus streaming
joins. No Kafka, Spark or clock: the compute hops feed it records, watermarks and processing
time, and turn what it emits into result changes."""
