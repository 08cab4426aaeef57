"""The daemon as operators watch it: its JSON logs, HTTP endpoint, start-up heap, systemd unit and notify socket, trace
context and experiment tracking."""
