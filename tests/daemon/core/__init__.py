"""The daemon's core in process, no broker or child: the scheduler, a job's lifecycle, intake and the publisher on the
in-memory fakes (tests/core.py), and pure parts beside them."""
