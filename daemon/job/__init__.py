"""One job, from its `accepted` event to its terminal one: its state machine (lifecycle.py), the runner
that walks it (runner.py), the child's supervision, its checkpoints' uploads, its gate and its events."""
