"""The trainers the installed TRL ships, beside the ones adapterd's method table names.

`python -m handlers.contract.trl_trainers` prints them as JSON: TRL's version, its stable trainers (the
`*Trainer` classes `trl` exports), its experimental ones (each `trl.experimental` module that
defines a `*Trainer`, by its import path), and for each row of the method table whether this TRL
has its trainer and config. `.ci/canary` runs it in the locked environment and in the newest one and
prints what TRL added, promoted from experimental and removed; tests/handlers/test_method_table.py
holds the table's TRL ranges to what this TRL has.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from importlib.metadata import version
from typing import Any

from schemas.methods import METHODS, unsupported_reason


def resolves(path: str) -> bool:
    """Whether `trl.experimental.orpo.ORPOTrainer` (a class by its import path) imports here."""
    module, _, name = path.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)  # what this install of TRL has, by its name
    except ImportError:
        return False


def stable_trainers() -> list[str]:
    import trl

    return sorted(f"trl.{name}" for name in dir(trl) if name.endswith("Trainer") and not name.startswith("_"))


def experimental_trainers() -> list[str]:
    """`trl.experimental.<module>.<Name>Trainer` for each experimental module that defines one (a
    module whose optional dependencies are missing here is left out)."""
    import trl.experimental

    found = []
    for module in pkgutil.iter_modules(trl.experimental.__path__):
        try:
            loaded = importlib.import_module(f"trl.experimental.{module.name}")
        except Exception:  # an optional dependency of that trainer is not installed here
            continue
        found += [
            f"trl.experimental.{module.name}.{name}"
            for name in dir(loaded)
            if name.endswith("Trainer")
            and not name.startswith("_")
            # a trainer of the module's own, not one it imports from elsewhere
            and getattr(getattr(loaded, name), "__module__", "").startswith(f"trl.experimental.{module.name}")
        ]
    return sorted(found)


def report() -> dict[str, Any]:
    trl_version = version("trl")
    return {
        "trl": trl_version,
        "stable": stable_trainers(),
        "experimental": experimental_trainers(),
        "methods": {
            name: {
                "trainer": row.trainer,
                "config": row.config,
                "range": row.trl_range or "any",
                "present": resolves(row.trainer) and resolves(row.config),
                "supported": unsupported_reason(name, trl_version) is None,
            }
            for name, row in METHODS.items()
        },
    }


def drift(report: dict[str, Any]) -> list[str]:
    """Where the method table and this TRL disagree, a line per method: a method the table runs on
    this release whose trainer or config it lacks (TRL removed it: the row's range must end before),
    or one the table refuses here whose trainer it has (the range is too narrow)."""
    trl = report["trl"]
    problems = []
    for method, row in report["methods"].items():
        said = f"trl{row['range']}" if row["range"] != "any" else "every trl release"
        if row["supported"] and not row["present"]:
            problems.append(
                f"method {method}: the table runs it on {said}, and trl {trl} lacks "
                f"{row['trainer']} or {row['config']}: TRL removed it by {trl}; end the row's range "
                "(trl_below) at the first release without it"
            )
        elif not row["supported"] and row["present"]:
            problems.append(
                f"method {method}: the table runs it on {said} only, and trl {trl} has "
                f"{row['trainer']}: widen the row's range"
            )
    return problems


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What TRL changed between two reports, a line each: trainers added, promoted from experimental
    to stable, removed; and each method of the table whose trainer one has and the other lacks."""

    def short(path: str) -> str:
        return path.rsplit(".", 1)[-1]

    lines = []
    old_stable, new_stable = set(old["stable"]), set(new["stable"])
    old_exp, new_exp = set(old["experimental"]), set(new["experimental"])
    promoted = {t for t in new_stable - old_stable if short(t) in {short(e) for e in old_exp - new_exp}}
    lines += [f"promoted from experimental: {t}" for t in sorted(promoted)]
    lines += [f"added: {t}" for t in sorted((new_stable - old_stable - promoted) | (new_exp - old_exp))]
    gone = {e for e in old_exp - new_exp if short(e) in {short(t) for t in promoted}}
    lines += [f"removed: {t}" for t in sorted((old_stable - new_stable) | (old_exp - new_exp - gone))]
    for name, row in new["methods"].items():
        before = old["methods"].get(name, {}).get("present")
        if before is not None and before != row["present"]:
            lines.append(
                f"method {name}: trl {new['trl']} {'has' if row['present'] else 'lacks'} {row['trainer']} (trl "
                f"{old['trl']} {'had' if before else 'lacked'} it)"
            )
    return lines


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--changes"]:  # --changes OLD.json NEW.json: two reports, what TRL changed between them
        reports = [json.loads(open(path).read()) for path in sys.argv[2:4]]
        print("\n".join(changes(*reports)) or "no trainer added, promoted or removed")
    else:
        print(json.dumps(report(), indent=2))
