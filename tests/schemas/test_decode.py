import json
from typing import Any

import pytest

from schemas import Rejection, RequestBase, SFTRequest, decode_request


def valid() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "request_id": "req-1",
        "method": "sft",
        "model": {"id": "org/base"},
        "dataset": {"rows": [{"text": "hello"}]},
        "output": {"repo_id": "org/adapter"},
    }


def rejection(document: Any, key: bytes | None = None) -> Rejection:
    outcome = decode_request(json.dumps(document).encode(), key)
    assert isinstance(outcome, Rejection), outcome
    return outcome


def test_valid_request_decodes_with_defaults() -> None:
    request = decode_request(json.dumps(valid()).encode())
    assert isinstance(request, SFTRequest)
    assert request.output.private is True
    assert request.peft is not None and request.peft.r == 16
    assert request.set_fields("training") == {}


def test_full_fine_tune_is_peft_null() -> None:
    request = decode_request(json.dumps({**valid(), "peft": None}).encode())
    assert isinstance(request, SFTRequest) and request.peft is None


def test_not_json_keeps_the_key_as_request_id() -> None:
    outcome = decode_request(b"\xff{not json", b"req-7")
    assert isinstance(outcome, Rejection)
    assert outcome.reason == "not_json"
    assert outcome.request_id == "req-7"
    assert outcome.errors[0].path == ""


def test_json_that_is_not_an_object() -> None:
    outcome = rejection([1, 2, 3])
    assert outcome.reason == "not_an_object"
    assert "got list" in outcome.errors[0].message


@pytest.mark.parametrize("method", ["sft2", None])
def test_unknown_or_missing_method_names_the_known_ones(method: str | None) -> None:
    outcome = rejection({**valid(), "method": method})
    assert outcome.reason == "unknown_method"
    assert outcome.request_id == "req-1"
    assert outcome.errors[0].path == "method"
    assert (
        "known methods: cpo, distillation, dpo, gkd, grpo, kto, online_dpo, orpo, ppo, reward, rloo, sft"
        in outcome.errors[0].message
    )


def test_each_offending_field_is_named() -> None:
    document = valid()
    document["training"] = {"learning_rat": 0.1, "max_steps": 0}
    document["peft"] = {"r": "four"}
    document["request_id"] = "has spaces"
    outcome = rejection(document)
    paths = {error.path: error.message for error in outcome.errors}
    assert outcome.reason == "invalid"
    assert "unknown field" in paths["training.learning_rat"]
    assert "greater than or equal to 1" in paths["training.max_steps"]
    assert "peft.r" in paths
    assert "request_id" in paths
    assert outcome.request_id is None


def test_an_unknown_field_names_the_field_it_is_most_likely_a_typo_of() -> None:
    nested = rejection({**valid(), "training": {"learning_rat": 0.1}})
    assert [(e.path, e.message) for e in nested.errors] == [
        ("training.learning_rat", "unknown field; not part of schema version 1; did you mean 'learning_rate'?")
    ]
    top = rejection({**valid(), "trainig": {"learning_rate": 0.1}})
    assert [(e.path, e.message) for e in top.errors] == [
        ("trainig", "unknown field; not part of schema version 1; did you mean 'training'?")
    ]
    # the method's own block, and a reward function picked by its `name` (a discriminated union)
    grpo = {**valid(), "method": "grpo", "dataset": {"rows": [{"prompt": "p", "answer": "a"}]}}
    block = rejection({**grpo, "rewards": {"functions": [{"name": "exact_match", "colum": "answer"}]}})
    assert {(e.path, e.message) for e in block.errors} >= {
        ("rewards.functions.0.colum", "unknown field; not part of schema version 1; did you mean 'column'?")
    }
    method_block = rejection({**grpo, "grpo": {"num_generation": 4}}).errors[0]
    assert method_block.message.endswith("did you mean 'num_generations'?")


def test_an_unknown_field_with_nothing_close_gets_no_guess() -> None:
    outcome = rejection({**valid(), "training": {"xyzzy": 1}})
    assert [(e.path, e.message) for e in outcome.errors] == [
        ("training.xyzzy", "unknown field; not part of schema version 1 (check the spelling)")
    ]


def test_a_misspelt_method_key_is_named() -> None:
    document = valid()
    document["methd"] = document.pop("method")
    outcome = rejection(document)
    assert outcome.reason == "unknown_method"
    assert outcome.errors[0].message.startswith("missing (did you mean 'method' for 'methd'?); known methods: ")
    del document["methd"]
    assert rejection(document).errors[0].message.startswith("missing; known methods: ")


def test_dataset_needs_exactly_one_source() -> None:
    document = valid()
    document["dataset"] = {"id": "org/data", "rows": [{"text": "x"}]}
    outcome = rejection(document)
    assert [e.path for e in outcome.errors] == ["dataset"]
    assert "exactly one of 'id'" in outcome.errors[0].message


def test_inline_rows_are_bounded() -> None:
    document = valid()
    document["dataset"] = {"rows": [{"text": "x"}] * 10_001}
    outcome = rejection(document)
    assert outcome.errors[0].path == "dataset.rows"


def test_a_token_hidden_behind_json_escapes_is_still_found() -> None:
    """The raw-bytes shortcut skips the walk only when no literal can spell a credential; a `\\u`
    escape can, so such a message is walked and the decoded token found."""
    token = "hf_" + "x" * 34
    escaped = "".join(f"\\u{ord(c):04x}" for c in token)
    raw = (
        '{"schema_version": 1, "request_id": "r1", "method": "sft", "metadata": {"note": "' + escaped + '"}}'
    ).encode()
    rejection = decode_request(raw)
    assert isinstance(rejection, Rejection) and rejection.reason == "secret_in_request"
    assert [error.path for error in rejection.errors] == ["metadata.note"]
    assert token not in repr(rejection)


def test_a_job_may_name_the_hosts_its_gpus_span_a_multiple_of_them() -> None:
    """`resources.hosts`: how many hosts the job's GPUs span (a run on the Ray cluster when more than one), each
    host as many of them; left out, one."""
    spread = decode_request(json.dumps({**valid(), "resources": {"gpus": 4, "hosts": 2}}).encode())
    assert isinstance(spread, SFTRequest) and (spread.resources.gpus, spread.resources.hosts) == (4, 2)
    assert decode_request(json.dumps(valid()).encode()).resources.hosts == 1  # type: ignore[union-attr]
    uneven = rejection({**valid(), "resources": {"gpus": 3, "hosts": 2}}).errors
    assert [(e.path, e.message) for e in uneven] == [
        (
            "resources.hosts",
            "2 hosts share the job's GPUs evenly, and resources.gpus is 3: set gpus to a multiple of hosts",
        )
    ]
    assert [e.path for e in rejection({**valid(), "resources": {"gpus": 65, "hosts": 65}}).errors] == [
        "resources.gpus",
        "resources.hosts",
    ]


def test_sharding_is_asked_in_resources_and_refused_where_it_does_not_apply() -> None:
    """`resources.shard: fsdp` (handlers/toolkit/distributed/fsdp.py) across 2 GPUs or more, for what shards so far;
    the trainer's own FSDP and DeepSpeed arguments stay refused, pointing at it."""
    sharded = {**valid(), "resources": {"gpus": 2, "shard": "fsdp"}}
    request = decode_request(json.dumps(sharded).encode())
    assert isinstance(request, SFTRequest) and request.resources.shard == "fsdp"
    assert isinstance(decode_request(json.dumps({**sharded, "peft": None}).encode()), SFTRequest)
    # Left out, it is 'auto': the daemon's plan decides (daemon/resources/shards.py), on one GPU and for any method.
    assert decode_request(json.dumps(valid()).encode()).resources.shard == "auto"  # type: ignore[union-attr]
    assert (
        decode_request(
            json.dumps(
                {
                    **valid(),
                    "method": "dpo",
                    "dataset": {"rows": [{"prompt": "a", "chosen": "b", "rejected": "c"}]},
                    "resources": {"gpus": 2},
                }
            ).encode()
        ).resources.shard
        == "auto"
    )  # type: ignore[union-attr]

    def refused(document: dict[str, Any]) -> dict[str, str]:
        return {error.path: error.message for error in rejection(document).errors}

    assert refused({**valid(), "resources": {"gpus": 1, "shard": "fsdp"}}) == {
        "resources.shard": (
            "'fsdp' shards the model across the job's GPUs, and resources.gpus is 1: set gpus to 2 or more"
        )
    }
    assert (
        "not for method orpo"
        in refused(
            {**sharded, "method": "orpo", "dataset": {"rows": [{"prompt": "a", "chosen": "b", "rejected": "c"}]}}
        )["resources.shard"]
    )
    assert "quantized" in refused({**sharded, "model": {"id": "org/base", "quantization": "4bit"}})["resources.shard"]
    preferences = {"rows": [{"prompt": "a", "chosen": "b", "rejected": "c"}]}
    assert "full fine-tune only" in refused({**sharded, "method": "reward", "dataset": preferences})["resources.shard"]
    assert isinstance(
        decode_request(json.dumps({**sharded, "method": "reward", "dataset": preferences, "peft": None}).encode()),
        RequestBase,
    )
    evaluated = {**sharded, "dataset": {"id": "org/chat", "test_split_size": 0.1}}
    assert isinstance(
        decode_request(json.dumps({**evaluated, "evaluation": {"baselines": ["base"]}}).encode()), SFTRequest
    )
    rewards = {"suites": [{"kind": "rewards", "functions": [{"name": "think_format"}]}]}
    assert "a 'rewards' suite" in refused({**evaluated, "evaluation": rewards})["resources.shard"]
    grpo = {
        **sharded,
        "method": "grpo",
        "dataset": {"rows": [{"prompt": "a"}]},
        "rewards": {"functions": [{"name": "think_format"}]},
    }
    assert isinstance(decode_request(json.dumps(grpo).encode()), RequestBase)
    assert "vLLM is not offered sharded" in refused({**grpo, "grpo": {"use_vllm": True}})["resources.shard"]
    assert (
        "peft.modules_to_save"
        in refused({**sharded, "peft": {"r": 4, "modules_to_save": ["lm_head"]}})["resources.shard"]
    )
    assert isinstance(
        decode_request(json.dumps({**sharded, "output": {"repo_id": "org/adapter", "push": "merged"}}).encode()),
        SFTRequest,
    )
    for field in ("fsdp", "fsdp_config", "deepspeed"):
        message = refused({**sharded, "training": {field: "x"}})[f"training.{field}"]
        assert "resources.shard" in message, message
