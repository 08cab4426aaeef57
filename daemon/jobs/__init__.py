"""The scheduler: which request runs where and when (GPU slots, one job per partition, reservations for
requests of several GPUs), retries and cancels, and what a job's published end does to its record. One
job's own lifecycle is daemon/job/; what it needs of the host (slots, memory) is daemon/resources/."""
