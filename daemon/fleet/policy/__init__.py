"""The fleet's decisions as pure functions of the events every host reads: no Kafka, no clock (the caller gives
`now`). What a free slot takes and which job a higher class stops (order.py, drain.py), when each waiting request
starts and whom to tell (eta.py, kinds.py, telling.py), the teams' usage and the jobs running (usage.py, running.py),
what a request's `after` still waits for (after.py), GPU-hours for chargeback (chargeback.py), and the ETAs' error on
a replayed trace (replay.py). Hosts that read the same events decide alike."""
