"""Prometheus metrics of the daemon, on the default registry of `prometheus_client`.

Names follow Prometheus conventions: counters end in `_total`, durations are in seconds.
"""

from __future__ import annotations

from functools import cache

from prometheus_client import Counter, Gauge, Histogram

JOBS = Counter("adapterd_jobs", "Jobs that reached a terminal event, by outcome.", ["outcome"])
STAGE_SECONDS = Histogram(
    "adapterd_stage_duration_seconds",
    "Seconds a job spent in each stage.",
    ["stage"],
    buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 48 * 3600),
)
SLOTS = Gauge("adapterd_slots", "Job slots of this host (one per GPU, or CPU slots).")
SLOTS_BUSY = Gauge("adapterd_slots_busy", "Job slots in use.")
CONSUMER_LAG = Gauge(
    "adapterd_consumer_lag", "Requests in the partition after the one this daemon will read next.", ["partition"]
)
HUB_RETRIES = Counter("adapterd_hub_push_retries", "Hub push attempts retried after a transient error.")
INTAKE_ERRORS = Counter(
    "adapterd_intake_internal_errors",
    "Records whose decoding, policy check or rejection raised unexpectedly (rejected as internal), by exception class.",
    ["exception"],
)
UNREADABLE_RECORDS = Counter(
    "adapterd_unreadable_records",
    "Records the Kafka client could not read (a codec it lacks, a corrupt batch, a header name not UTF-8), "
    "stepped past by their offset (daemon/kafka/unreadable.py), by topic and exception class.",
    ["topic", "exception"],
)
FORKSERVER_FAILURES = Counter(
    "adapterd_forkserver_failures",
    "Fork servers that refused to serve (their self-check failed) or died after they were ready.",
    ["reason"],
)
WARM_START = Gauge(
    "adapterd_warm_start_mode", "How job children start now: 1 for the mode in force (fork, spawn, cold).", ["mode"]
)
QUEUE_WAITING = Gauge(
    "adapterd_queue_waiting",
    (
        "With priority classes: requests this host holds read from its classes' queues that could start (due, "
        "decoded) and have not, by class; a host with room reads the queues, so a free slot beside a count above "
        "0 is a request it may not take."
    ),
    ["priority_class"],
)
PREEMPTIONS = Counter(
    "adapterd_preemptions", "Jobs of this host stopped at a checkpoint for a request of a higher class."
)
REJECTED = Counter("adapterd_requests_rejected", "Requests rejected at intake, by reason.", ["reason"])
WORK_DIR_FREE = Gauge(
    "adapterd_work_dir_free_bytes",
    "Bytes free on the file system of work_dir (job folders, checkpoints, the Hub cache).",
)
GPU_JOBS = Gauge(
    "adapterd_gpu_jobs", "Jobs placed on each GPU (more than one only when GPUs are packed: max_jobs_per_gpu).", ["gpu"]
)
GPU_MEMORY_RESERVED = Gauge(
    "adapterd_gpu_memory_reserved_bytes", "The memory shares of the jobs on each packed GPU.", ["gpu"]
)
JOB_MEMORY_PEAK = Histogram(
    "adapterd_job_memory_peak_bytes",
    "Jobs' measured memory peak on their device (GPU allocator peak, or the child's peak "
    "RSS on a CPU host), by method.",
    ["method"],
    buckets=tuple(2.0**power for power in range(28, 38)),  # 256 MiB to 128 GiB
)
JOB_MEMORY_RATIO = Histogram(
    "adapterd_job_memory_estimate_ratio",
    "Jobs' measured GPU allocator peak over their estimate before the history's scale, by method.",
    ["method"],
    buckets=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0),
)
PRUNED = Counter(
    "adapterd_job_folders_pruned",
    "Job folders removed by retention (`folder`), and succeeded jobs' checkpoints (`checkpoints`).",
    ["what"],
)


@cache
def rejected(reason: str) -> Counter:
    """REJECTED's counter for one reason, looked up once: `labels()` checks its arguments and takes
    a lock on every call (about 1 us), and intake rejects thousands of messages a second. The
    reasons are a closed set, so the cache stays small; REJECTED is never cleared, so the
    counter looked up stays the one exported."""
    return REJECTED.labels(reason)


STORE_UNTRUSTED = Counter(
    "adapterd_checkpoint_store_untrusted",
    (
        "Documents and files read from the checkpoint store that were skipped, not used (docs/guarantees.md, 'Whom to "
        "trust'), by reason: unsigned, unknown_key, bad_signature, malformed, misplaced (signed for another request, "
        "step or kind), unsafe_name, link, too_large."
    ),
    ["reason"],
)
