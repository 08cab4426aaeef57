"""`schemas`, the client's old name for the wire contract (adapterd-client 0.1), kept for one release: importing it
warns once and gives `adapterd_schemas` itself, and each `schemas.<module>` is `adapterd_schemas.<module>`.

The wheel installs this file as the top-level package `schemas` (client/pyproject.toml's force-include). A name that
plain is one a team's own project may well have, so the contract now installs as `adapterd_schemas`; this alias goes
in adapterd-client 0.3.0.

Aliases, not copies: a second copy of the modules would hold other classes, and an event decoded through one name
would fail an isinstance check against the other. So the package's entry in `sys.modules` becomes `adapterd_schemas`,
and a finder at the front of `sys.meta_path` answers `schemas.<module>` with the module already imported, or imported
then, as `adapterd_schemas.<module>`."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

OLD = __name__  # "schemas", as the wheel installs this file
NEW = "adapterd_schemas"
DROPPED_IN = "adapterd-client 0.3.0"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `schemas.<module>` where `adapterd_schemas.<module>` exists, and loads it as that very module."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}  # the real spec of each module being aliased

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(OLD + "."):
            return None
        real = importlib.util.find_spec(NEW + fullname[len(OLD) :])
        if real is None:
            return None  # "No module named 'schemas.<module>'", as for any name not there
        return importlib.util.spec_from_loader(fullname, self, is_package=real.submodule_search_locations is not None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(NEW + spec.name[len(OLD) :])
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Between the two calls the import system set the module's __spec__ to the alias's (the one attribute it sets
        # on a module that has them all): the real module gets its own back, so reloading it, or asking where it came
        # from, still answers for adapterd_schemas.
        module.__spec__ = self._specs.pop(module.__name__)


warnings.warn(
    f"the `{OLD}` package of adapterd-client is deprecated and goes in {DROPPED_IN}: import `{NEW}` instead"
    f" (the same modules; `{OLD}` is a name any project may have)",
    DeprecationWarning,
    # Past this module to the line that imports it (warnings skips the import system's frames), so Python's default
    # filters show it where __main__ imports `schemas`, as they show any DeprecationWarning.
    stacklevel=2,
)

if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
sys.modules[OLD] = importlib.import_module(NEW)  # `import schemas` gives what this leaves here: the package itself
