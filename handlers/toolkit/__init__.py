"""What every method's handler stands on, in a job's child: the shared sequence (`sequence`:
load the data and the base, train, save, report) and the steps it is made of: `loading` (data,
models, preflight), `sources` (dataset sources), `vision`, `chat_template`, `training` (TRL's
config, LoRA with `lora_patterns`, the artifact), `reporting` (the status pipe back to the
daemon, the messages of handlers/protocol.py) and `memory`, `fast` (the host's speed settings),
`rewards`, `math_verifier` and `vllm_support` (the online methods' and distillation's), and
`evaluation*` (what a request measures after training); `deferred` (what the training stack's
imports leave for a job's first use).

Below the methods (handlers/methods/) and the entry points (handlers/child/): it imports neither
(tests/test_boundaries.py holds it). A handler imports each name from the module that defines it.
This package's `__init__` imports nothing; its modules import torch and TRL.
"""
