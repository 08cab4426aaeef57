"""The fleet as one queue: priority classes, fair share between teams, preemption, and every waiting request visible."""
