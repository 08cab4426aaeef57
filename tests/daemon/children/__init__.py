"""A job's child process: the fork server's safety, warm starts (fork and spawn), and the environment a child gets."""
