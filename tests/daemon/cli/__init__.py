"""The adapterd command line as users call it: each command in process, against a real broker,
and against running daemons."""
