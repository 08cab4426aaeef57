"""The training methods adapterd runs, one self-contained module each, in the child process only.

`HANDLERS` maps each method of the method table (`schemas.methods.METHODS`) to the module it names,
`handlers/<handler>.py`, for the methods this TRL ships: `ppo` exists only on trl 1.10 to 1.12
(TRL removed it in 1.13.0), so elsewhere its module is not imported. A new method is one row in
the table, one module here, one example and one test file.
Importing this package imports torch and TRL: the daemon never does.
"""

from handlers.child.deferred import defer_in_fork_server

# First, before anything below imports torch: in the fork server, modules that touch CUDA when
# imported are imported in name only (handlers/child/deferred.py says why).
defer_in_fork_server()

from importlib import import_module  # noqa: E402
from importlib.metadata import version  # noqa: E402
from types import ModuleType  # noqa: E402

from schemas.methods import METHODS, unsupported_reason  # noqa: E402

HANDLERS: dict[str, ModuleType] = {
    name: import_module(f"handlers.{method.handler}")
    for name, method in METHODS.items()
    if unsupported_reason(name, version("trl")) is None
}
