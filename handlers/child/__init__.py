"""The processes the daemon starts, by module name (`python -m handlers.child.<entry>`), and what
only runs as one: each module here is a process's `main`, above the methods and the toolkit.

- `runner`: one job in one process (a spawned child, or one forked by the fork server);
- `forkserver`: the training stack imported once, a child forked per job;
- `launch`: torchrun's agent for a multi-GPU job, starting a `runner` per GPU;
- `math_worker`: TRL's math rewards in a process of their own, started by a job's child
  (handlers/toolkit/rewards/math_verifier.py), so an answer that never ends can be killed.

Nothing below imports these (tests/test_boundaries.py holds it). This package's `__init__` imports
nothing; the entry points import the training stack only when they run.
"""
