"""A job's log as the HTTP endpoint serves it: `jobs/<id>/child.log`, the file itself and nothing it
points to.

The endpoint serves it to whoever has the fleet's logs token, from a thread of the endpoint. A
`child.log` (or a job folder) that is a symbolic link could hand out any file the daemon can read,
and a FIFO there would hold the thread, so the folder and the file are opened without following a
link (O_NOFOLLOW on each, relative to the folder above) and without waiting (O_NONBLOCK), and only
a regular file is read.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from schemas.common import REQUEST_ID_PATTERN

LOG_NAME = "child.log"
_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_job_log(jobs_dir: Path, request_id: str, offset: int, limit: int) -> tuple[bytes, int] | None:
    """The log of `request_id` from `offset`, at most `limit` bytes, and its size; None when this
    host has none (no such job, a request id that is not one, a link, anything but a file)."""
    if not re.fullmatch(REQUEST_ID_PATTERN, request_id):
        return None
    jobs = folder = log = -1
    try:
        jobs = os.open(jobs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        folder = os.open(request_id, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=jobs)
        log = os.open(LOG_NAME, os.O_RDONLY | _NOFOLLOW, dir_fd=folder)
        found = os.fstat(log)
        if not stat.S_ISREG(found.st_mode):
            return None
        return os.pread(log, limit, min(offset, found.st_size)), found.st_size
    except OSError:  # ELOOP: a link; ENOENT: no such job here; ENOTDIR: not a folder
        return None
    finally:
        for descriptor in (log, folder, jobs):
            if descriptor >= 0:
                os.close(descriptor)
