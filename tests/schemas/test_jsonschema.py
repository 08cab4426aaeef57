from handlers.contract.jsonschema import SCHEMA_DIR, generated_schemas


def test_checked_in_json_schemas_match_the_models() -> None:
    generated = generated_schemas()
    on_disk = {path.name: path.read_text() for path in SCHEMA_DIR.glob("*.json")}
    assert set(on_disk) == set(generated), "run `python -m handlers.contract.jsonschema` to regenerate"
    for name, text in generated.items():
        assert on_disk[name] == text, f"{name} drifted from the models; run `python -m handlers.contract.jsonschema`"


def test_request_schema_forbids_unknown_fields() -> None:
    import json

    schema = json.loads(generated_schemas()["request.schema.json"])
    assert set(schema["discriminator"]["mapping"]) == {
        "sft",
        "dpo",
        "kto",
        "reward",
        "grpo",
        "rloo",
        "distillation",
        "orpo",
        "cpo",
        "gkd",
        "online_dpo",
        "ppo",
    }
    for name in ("SFTRequest", "DPORequest", "TrainingSpec", "GRPOSpec", "LoraSpec"):
        assert schema["$defs"][name]["additionalProperties"] is False, name
    assert "learning_rate" in schema["$defs"]["TrainingSpec"]["properties"]
    assert "num_generations" in schema["$defs"]["GRPOSpec"]["properties"]
