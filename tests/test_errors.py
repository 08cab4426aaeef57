"""Every exception class adapterd defines, in daemon/ and schemas/, is an AdapterdError (daemon/errors.py
draws the tree): an operator or a caller catches adapterd's own errors by one name, and a bug that
raises a library's error is not mistaken for one of them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import daemon
import schemas
from schemas.common import AdapterdError


def defined_exceptions() -> list[type[BaseException]]:
    found = []
    for package in (daemon, schemas):
        for module_info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if module_info.name.endswith("__main__"):
                continue
            module = importlib.import_module(module_info.name)
            found += [
                value
                for value in vars(module).values()
                if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__
            ]
    return found


def test_every_error_adapterd_defines_is_an_adapterd_error() -> None:
    found = defined_exceptions()
    assert len(found) >= 8  # the walk found them: ConfigError, JobFailed, PushFailed, TopicMissing, ...
    assert [f"{cls.__module__}.{cls.__name__}" for cls in found if not issubclass(cls, AdapterdError)] == []


def test_the_narrower_errors_keep_the_builtin_kind_callers_catch() -> None:
    from daemon.errors import ConfigError, ForkServerGone, TopicMissing

    assert issubclass(TopicMissing, ConfigError) and issubclass(TopicMissing, LookupError)
    assert issubclass(ForkServerGone, ConnectionError)
