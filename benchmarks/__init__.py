"""Benchmarks of adapterd against the plain alternative, side by side in one run: `python -m benchmarks`."""
