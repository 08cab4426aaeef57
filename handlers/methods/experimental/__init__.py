"""The methods TRL ships on its experimental layer (`trl.experimental`: ORPO, CPO, GKD, online DPO,
PPO), kept apart as TRL keeps them: their trainers' arguments and behaviour may change in any TRL
release, so a request for one says `experimental` in its method's row (`schemas.methods.METHODS`)
and docs/methods.md. Each module is a method's handler like the stable ones beside this folder,
named in the method table (`experimental.orpo`); beside them, `reference_free` (ORPO's and CPO's
one trainer call) and `ppo_checkpoints` (the checkpoints and resume trl 1.12's PPOTrainer lacks).
This package's `__init__` imports nothing.
"""
