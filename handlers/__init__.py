"""What runs outside the daemon, in five parts; importing this package imports none of them.

- `handlers/methods/`: the training methods, one module each, and `HANDLERS`, which maps each
  method of the method table to its module (torch and TRL: the child only);
- `handlers/child/`: the processes the daemon starts by module name (`runner`, `forkserver`,
  `launch`) and the math worker a job starts: each module a process's entry point, above the methods;
- `handlers/toolkit/`: the steps every method stands on in a job's child (loading, training,
  reporting, memory, rewards, evaluation), below the methods;
- `handlers/contract/`: the request contract's build tooling, which reads TRL and writes what
  schemas/ checks in; never imported at run time;
- `handlers/fixtures/`: the tiny models the demo and the tests build instead of downloading one.

Beside them, `handlers/protocol.py`: the job spec a child reads from its parent and the messages
it writes back, pydantic models and nothing of the training stack. The daemon imports it and
nothing else of handlers/; the child never imports the daemon.
"""
