"""Which methods this host can run, decided by the installed TRL without importing it.

The wire contract (`schemas.REQUEST_MODELS`) names every method adapterd knows; a host runs those
its TRL provides. A request for another is rejected with what it needs and what is installed.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet

from schemas.request import REQUEST_MODELS

# Methods that need a TRL range narrower than the lock's; every other method runs on any locked TRL.
TRL_REQUIREMENTS: dict[str, tuple[str, str]] = {
    "ppo": (">=1.10,<1.13", "trl.experimental.ppo lived in trl 1.10 to 1.12.0; TRL removed PPO in 1.13.0 (huggingface/trl#7020)"),
}


@cache
def trl_version() -> str | None:
    try:
        return version("trl")
    except PackageNotFoundError:
        return None


def unsupported_reason(method: str) -> str | None:
    """Why this host cannot run `method`, or None when it can."""
    installed = trl_version()
    if installed is None:
        return "trl is not installed on this host"
    if method in TRL_REQUIREMENTS:
        needed, why = TRL_REQUIREMENTS[method]
        if installed not in SpecifierSet(needed):
            return f"method {method} needs trl{needed} ({why}); this host has trl {installed}"
    return None


def available_methods() -> list[str]:
    return [method for method in REQUEST_MODELS if unsupported_reason(method) is None]
