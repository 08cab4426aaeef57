"""Which methods this host can run, decided by the installed TRL without importing it.

The method table (`schemas.methods.METHODS`) names every method adapterd knows and the TRL releases
each needs; a host runs those its TRL provides. A request for another is rejected with what it
needs and what is installed.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version

from schemas import methods


@cache
def trl_version() -> str | None:
    try:
        return version("trl")
    except PackageNotFoundError:
        return None


@cache
def library_version(distribution: str) -> str | None:
    """The installed version of an optional library (an evaluation's `lm-eval`), read without importing it."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def unsupported_reason(method: str) -> str | None:
    """Why this host cannot run `method`, or None when it can."""
    return methods.unsupported_reason(method, trl_version())


def available_methods() -> list[str]:
    return [method for method in methods.METHODS if unsupported_reason(method) is None]
