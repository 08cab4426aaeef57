"""A job's child process: the fork server's safety, warm starts (fork and spawn), the environment a child gets, and a
child's job and message stream on this host."""
