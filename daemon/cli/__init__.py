"""The command line: `adapterd run`, the client commands (submit, events, cancel, status, topics,
methods, schema), `convert` and `demo`."""
