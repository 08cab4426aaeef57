"""Malformed requests for fuzzing the decoder: mutations of the shipped examples, and garbage.

Deterministic for a seed. Some mutations happen to leave a request valid (dropping an optional
field); callers tell the two apart by decoding.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import schemas

EXAMPLES = [
    json.loads(path.read_text()) for path in sorted((Path(schemas.__file__).parent / "examples").glob("*.json"))
]

ODD_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    10**40,
    -1e308,
    1.5,
    "",
    "x" * 5000,
    "\u0000",
    "\ud800",
    "../../etc/passwd",
    [],
    [None],
    {},
    {"a": {"b": {}}},
    float("nan"),
    float("inf"),
]


def _odd_value(rng: random.Random) -> Any:
    """One of ODD_VALUES, a copy of its own: the same dict set at two leaves, one inside the other, would
    be a cycle json cannot encode."""
    return copy.deepcopy(rng.choice(ODD_VALUES))


def leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += leaf_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += leaf_paths(value, (*prefix, index))
    return found


def set_leaf(document: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        document = document[part]
    document[path[-1]] = value


def _delete(document: Any, path: tuple[Any, ...]) -> None:
    for part in path[:-1]:
        document = document[part]
    del document[path[-1]]


def _encode(document: Any) -> bytes:
    return json.dumps(document, allow_nan=True).encode("utf-8", errors="surrogatepass")


def malformed_messages(count: int, seed: int = 0) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(count):
        example = copy.deepcopy(rng.choice(EXAMPLES))
        paths = leaf_paths(example)
        strategy = rng.randrange(9)
        if strategy == 0:  # random bytes
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        elif strategy == 1:  # truncated JSON
            text = _encode(example)
            yield text[: rng.randrange(1, len(text))]
        elif strategy == 2:  # another JSON type at the top
            yield _encode(rng.choice([[example], "request", 42, None, True, [], 1e309]))
        elif strategy == 3:  # a field removed
            _delete(example, rng.choice(paths))
            yield _encode(example)
        elif strategy == 4:  # a value of the wrong type or out of range
            set_leaf(example, rng.choice(paths), _odd_value(rng))
            yield _encode(example)
        elif strategy == 5:  # an unknown key somewhere
            containers = [p for p in paths if isinstance(_get(example, p), dict)] or [()]
            target = _get(example, rng.choice(containers))
            target[rng.choice(["learning_rte", "extra", "__proto__", "lora_r", "0"])] = 1
            yield _encode(example)
        elif strategy == 6:  # the method swapped or made unhashable
            example["method"] = rng.choice(["SFT", "ppo2", "", None, ["sft"], {"name": "sft"}, 3])
            yield _encode(example)
        elif strategy == 7:  # deep nesting
            depth = rng.choice([100, 5000, 100_000])
            yield b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a":' * depth + b"1" + b"}" * depth
        else:  # several mutations at once
            for _ in range(3):
                paths = leaf_paths(example)
                if paths:
                    set_leaf(example, rng.choice(paths), _odd_value(rng))
            yield _encode(example)


def _get(document: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        document = document[part]
    return document
