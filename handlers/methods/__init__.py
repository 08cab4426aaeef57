"""The training methods adapterd runs, one self-contained module each, in the child process only.

`HANDLERS` maps each method of the method table (`schemas.methods.METHODS`) to the module it names
(`schemas.methods.Method.module`): `handlers/methods/<handler>.py` for a stable method, and in
`handlers/methods/experimental/` for one TRL keeps in `trl.experimental` (apart, as TRL keeps
them), for the methods this TRL ships: `ppo` exists only on trl 1.10 to 1.12 (TRL removed it in
1.13.0), so elsewhere its module is not imported. A new method is one row in the table, one module
here, one example and one test file. A method's module imports no other
method's; what two share is said once in handlers/toolkit/ (or beside them, for a sequence only they
follow: experimental/reference_free.py for ORPO and CPO, experimental/ppo_checkpoints.py for PPO).
Importing this package imports torch and TRL: the daemon never does. What only some jobs use, and
what initialises CUDA when imported, it imports in name only (handlers/toolkit/deferred.py).
"""

from importlib import import_module
from importlib.metadata import version
from types import ModuleType

from handlers.toolkit import deferred
from schemas.methods import METHODS, unsupported_reason

with deferred.deferring():
    HANDLERS: dict[str, ModuleType] = {
        name: import_module(method.module)
        for name, method in METHODS.items()
        if unsupported_reason(name, version("trl")) is None
    }
