"""The child's runtime: the process a job runs in, and the steps every method's handler stands on.

- entry points the daemon starts by module name: `runner` (one job, one process), `forkserver`
  (the training stack imported once, a child forked per job; `deferred` keeps what touches CUDA at
  import out of it) and `launch` (torchrun's agent for a multi-GPU job);
- `reporting`: the status pipe back to the daemon (the messages of handlers/protocol.py);
- `common`: the sequence every handler follows, on `loading` (data, models, preflight),
  `sources` (dataset sources), `vision`, `chat_template`, `training` (TRL's config, LoRA with
  `lora_patterns`, the artifact), `rewards` and `vllm_support` (the online methods'), and
  `evaluation*` (what a request measures after training).

This package's `__init__` imports nothing; its modules import torch and TRL (the entry points only
when they run).
"""
