"""The local Hub's judgement of a model card (`testbed/hub_http.py` asks it when a card is validated
and when a commit carries one): its YAML front matter, and a `base_model` that names Hub models."""

from __future__ import annotations

import re

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def card_problem(content: str) -> str | None:
    """Like the Hub: a README.md's front matter must be a YAML mapping, and its `base_model` (a
    string or a list) must name Hub models, never a path on some host."""
    import yaml

    if not content.startswith("---\n") or "\n---" not in content[4:]:
        return None
    try:
        metadata = yaml.safe_load(content[4:].split("\n---", 1)[0])
    except yaml.YAMLError as exc:
        return f"invalid YAML: {exc}"
    if not isinstance(metadata, dict):
        return "metadata is not a mapping"
    base = metadata.get("base_model")
    bases = base if isinstance(base, list) else [] if base is None else [base]
    for name in bases:
        if not isinstance(name, str) or not HUB_ID.fullmatch(name):
            return f'"base_model" with value "{name}" is not valid. Use a model id from the Hub, e.g. google/gemma-2b'
    return None
