"""What each method needs is checked at intake: a request without it gets a `rejected` event naming the field."""

import json
from importlib import metadata
from typing import Any

from daemon.settings import Settings
from schemas import Rejected
from testbed.client import records_of, submit, terminal_events
from testbed.processes import DaemonProcess
from tests.helpers import example_request

WRONG_COLUMNS = {
    "sft": [{"question": "q", "answer": "a"}],
    "dpo": [{"prompt": "p", "chosen": "c"}],
    "kto": [{"prompt": "p", "completion": "c"}],
    "reward": [{"chosen": "c"}],
    "grpo": [{"question": "q", "answer": "a"}],
    "rloo": [{"completion": "c"}],
    "orpo": [{"prompt": "p", "rejected": "r"}],
    "cpo": [{"prompt": "p", "chosen": "c"}],
    "distillation": [{"completion": "c"}],
    "gkd": [{"prompt": "p", "completion": "c"}],
    "online_dpo": [{"question": "q", "answer": "a"}],
}
NEEDS = {
    "sft": "'messages' or 'completion' and 'prompt' or 'text'",
    "dpo": "'chosen' and 'rejected'",
    "kto": "'completion' and 'label' and 'prompt'",
    "reward": "'chosen' and 'rejected'",
    "grpo": "'prompt'",
    "rloo": "'prompt'",
    "orpo": "'chosen' and 'rejected'",
    "cpo": "'chosen' and 'rejected'",
    "distillation": "'prompt'",
    "gkd": "'messages'",
    "online_dpo": "'prompt'",
}


async def test_each_method_rejects_what_it_cannot_train_on(
    shared_daemon: DaemonProcess, shared_settings: Settings
) -> None:
    requests: dict[str, dict[str, Any]] = {
        f"{method}-columns": example_request(method, f"{method}-columns", dataset={"rows": rows})
        for method, rows in WRONG_COLUMNS.items()
    }
    requests["grpo-unknown-reward"] = example_request(
        "grpo", "grpo-unknown-reward", rewards={"functions": [{"name": "import_my_module"}]}
    )
    requests["rloo-unknown-reward"] = example_request(
        "rloo", "rloo-unknown-reward", rewards={"functions": [{"name": "os.system"}]}
    )
    requests["grpo-no-rewards"] = example_request("grpo", "grpo-no-rewards", rewards={"functions": []})
    requests["ppo-on-new-trl"] = example_request("ppo", "ppo-on-new-trl")
    for request in requests.values():
        await submit(shared_settings, request)

    events = await terminal_events(shared_settings, set(requests))
    rejected: dict[str, Rejected] = {}
    for request_id, evs in events.items():
        assert len(evs) == 1 and isinstance(evs[0], Rejected), (request_id, evs)
        rejected[request_id] = evs[0]

    for method, needs in NEEDS.items():
        [error] = rejected[f"{method}-columns"].errors
        assert error.path == "dataset.columns", method
        assert f"method {method} needs {needs}" in error.message, error.message

    for request_id in ("grpo-unknown-reward", "rloo-unknown-reward"):
        [error] = rejected[request_id].errors
        assert error.path == "rewards.functions.0"
        assert "'exact_match', 'regex_match', 'length_penalty', 'think_format'" in error.message

    [error] = rejected["grpo-no-rewards"].errors
    assert error.path == "rewards" and "at least one reward function or a reward model" in error.message

    ppo = rejected["ppo-on-new-trl"]
    assert ppo.reason == "unsupported_method" and ppo.errors[0].path == "method"
    # The installed TRL's version, whatever the lock (or .ci/canary) moved it to: PPO's range is the point.
    assert (
        "needs trl>=1.10,<1.13" in ppo.errors[0].message
        and f"this host has trl {metadata.version('trl')}" in ppo.errors[0].message
    )

    dead = await records_of(
        shared_settings, shared_settings.dlq_topic, [request_id.encode() for request_id in requests]
    )
    assert {record.key.decode() for record in dead if record.key} == set(requests)
    assert json.loads(dict(dead[0].headers)["adapterd-errors"])
