"""Jobs: the scheduler (slots, one job per partition, retries, cancels) and one job's lifecycle, its
state machine, its events and its supervision."""
