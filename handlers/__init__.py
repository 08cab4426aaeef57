"""The training methods adapterd runs, one self-contained module each, in the child process only.

A new method is one new module, one line in `HANDLERS`, one request model in `schemas.request`,
and one test file. Importing this package imports torch and TRL: the daemon never does.
`ppo` exists only on trl 1.10 to 1.12 (TRL removed it in 1.13.0), so it is imported only there.
"""

from types import ModuleType

from daemon.capabilities import unsupported_reason
from handlers import dpo, grpo, kto, orpo, reward, rloo, sft

HANDLERS: dict[str, ModuleType] = {
    "sft": sft,
    "dpo": dpo,
    "kto": kto,
    "reward": reward,
    "grpo": grpo,
    "rloo": rloo,
    "orpo": orpo,
}

# PPO exists only in trl 1.10 to 1.12.0 (see daemon.capabilities); elsewhere it is not importable.
if unsupported_reason("ppo") is None:
    from handlers import ppo

    HANDLERS["ppo"] = ppo
