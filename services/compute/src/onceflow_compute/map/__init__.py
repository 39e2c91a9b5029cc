"""The map hop: dedup.records -> the job on the engine, per micro-batch -> compute.partials.<job>
(or, for a transform, compute.results). Its stage: stage.py; a windowed job's event-time gate:
eventtime.py."""
