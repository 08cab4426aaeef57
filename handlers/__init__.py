"""The training methods adapterd runs, one self-contained module each, in the child process only.

A new method is one new module, one line in `HANDLERS`, one request model in `schemas.request`,
and one test file. Importing this package imports torch and TRL: the daemon never does.
"""

from types import ModuleType

from handlers import sft

HANDLERS: dict[str, ModuleType] = {
    "sft": sft,
}
