"""What runs outside the daemon, in four parts; importing this package imports none of them.

- `handlers/methods/`: the training methods, one module each, and `HANDLERS`, which maps each
  method of the method table to its module (torch and TRL: the child only);
- `handlers/child/`: the child's runtime: the entry points the daemon starts by module name
  (`runner`, `forkserver`, `launch`) and the steps every method stands on (loading, training,
  reporting, evaluation);
- `handlers/contract/`: the request contract's build tooling, which reads TRL and writes what
  schemas/ checks in; never imported at run time;
- `handlers/fixtures/`: the tiny models the demo and the tests build instead of downloading one.

The daemon never imports handlers/ and the child never imports the daemon: they speak through the
job spec and the status pipe's messages (schemas/job.py), which hold pydantic models and nothing of
the training stack.
"""
