"""The merge hop: compute.partials.<job> -> each key's changelog-backed state -> compute.results.
A plain aggregation's stage: aggregation.py; a windowed one's: windowed.py; a join's: joined.py
(the last two share event_time.py); what every merge stage shares: hop.py; partials: partials.py."""
