"""The daemon end to end as a process on the real broker with real TRL children: its outcomes, stops, restarts,
rebalances, outages, GPU slots, SASL, vision, signed events."""
