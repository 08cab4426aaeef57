"""Each policy rule refuses what it should, naming the request field and the setting that refused it."""

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.admission.policy import policy_errors, report_to
from daemon.cli.demo.requests import PROMPT_ROWS
from daemon.settings import Settings
from schemas import REQUEST_MODELS, RequestBase
from testbed.data import CHAT_ROWS
from testbed.fleet_keys import shared_fleet_keys
from tests.helpers import sft_request


def request(**overrides: Any) -> RequestBase:
    raw = sft_request("policy-1", **overrides)
    return REQUEST_MODELS[raw["method"]].model_validate(raw)


def refused(req: RequestBase, **settings: Any) -> dict[str, str]:
    return {error.path: error.message for error in policy_errors(req, Settings(**settings))}


def test_defaults_allow_a_plain_hub_request() -> None:
    assert refused(request()) == {}


def test_base_model_outside_the_allow_list() -> None:
    errors = refused(request(), allowed_models=["org/*"])
    assert "tiny/qwen2-chat is not allowed" in errors["model.id"] and "allowed_models" in errors["model.id"]
    assert refused(request(), allowed_models=["tiny/*"]) == {}


def test_reward_model_outside_the_allow_list() -> None:
    raw = sft_request(
        "policy-2", method="grpo", dataset={"rows": PROMPT_ROWS}, rewards={"model": {"id": "other/reward"}}
    )
    grpo = REQUEST_MODELS["grpo"].model_validate(raw)
    errors = refused(grpo, allowed_models=["tiny/*"])
    assert list(errors) == ["rewards.model.id"] and "other/reward" in errors["rewards.model.id"]


def test_reference_model_under_the_same_rules_as_the_base(tmp_path: Path) -> None:
    for method in ("dpo", "kto"):
        asking = REQUEST_MODELS[method].model_validate(
            sft_request(
                f"policy-{method}",
                method=method,
                dataset={"id": "tiny/preferences"},
                ref_model={"id": "other/sft-model"},
            )
        )
        errors = refused(asking, allowed_models=["tiny/*"])
        assert list(errors) == ["ref_model.id"] and "other/sft-model is not allowed" in errors["ref_model.id"]
        assert "allowed_models" in errors["ref_model.id"]
        assert refused(asking, allowed_models=["tiny/*", "other/*"]) == {}
    local = REQUEST_MODELS["dpo"].model_validate(
        sft_request(
            "policy-dpo-local", method="dpo", dataset={"id": "tiny/preferences"}, ref_model={"id": "/srv/models/sft"}
        )
    )
    assert "outside allowed_local_model_roots" in refused(local, allowed_local_model_roots=[tmp_path])["ref_model.id"]


def test_a_distillation_teacher_under_the_same_rules_as_the_base(tmp_path: Path) -> None:
    raw = sft_request(
        "policy-teacher", method="distillation", dataset={"id": "tiny/prompts"}, teacher_model={"id": "other/teacher"}
    )
    asking = REQUEST_MODELS["distillation"].model_validate(raw)
    errors = refused(asking, allowed_models=["tiny/*"])
    assert list(errors) == ["teacher_model.id"] and "other/teacher is not allowed" in errors["teacher_model.id"]
    assert refused(asking, allowed_models=["tiny/*", "other/*"]) == {}
    local = REQUEST_MODELS["distillation"].model_validate({**raw, "teacher_model": {"id": "/srv/models/teacher"}})
    assert (
        "outside allowed_local_model_roots" in refused(local, allowed_local_model_roots=[tmp_path])["teacher_model.id"]
    )


def test_local_model_outside_the_allowed_roots(tmp_path: Path) -> None:
    errors = refused(request(model={"id": "/srv/models/x"}), allowed_local_model_roots=[tmp_path])
    assert "outside allowed_local_model_roots" in errors["model.id"]
    assert refused(request(model={"id": str(tmp_path / "m")}), allowed_local_model_roots=[tmp_path]) == {}


def test_dataset_outside_the_allow_list() -> None:
    errors = refused(request(), allowed_datasets=["approved/*"])
    assert "tiny/chat-rows is not allowed" in errors["dataset.id"] and "allowed_datasets" in errors["dataset.id"]


def test_output_namespace_outside_the_allow_list() -> None:
    errors = refused(request(), allowed_output_namespaces=["adapters"])
    assert "namespace results is not allowed" in errors["output.repo_id"]
    assert refused(request(), allowed_output_namespaces=["results"]) == {}


def test_trust_remote_code_refused_unless_allowed() -> None:
    asking = request(model={"id": "tiny/qwen2-chat", "trust_remote_code": True})
    assert "allow_trust_remote_code" in refused(asking)["model.trust_remote_code"]
    assert refused(asking, allow_trust_remote_code=True) == {}


def test_timeout_above_the_maximum() -> None:
    errors = refused(request(timeout_s=7200), max_timeout_s=3600)
    assert errors == {"timeout_s": "7200 s; this host allows at most 3600 s (max_timeout_s)"}
    assert refused(request(timeout_s=600), max_timeout_s=3600) == {}


def test_dataset_size_above_the_maximum() -> None:
    assert "max_dataset_rows" in refused(request(dataset={"rows": CHAT_ROWS}), max_dataset_rows=3)["dataset.rows"]
    too_many = request(dataset={"id": "tiny/chat-rows", "max_samples": 50})
    assert "max_dataset_rows" in refused(too_many, max_dataset_rows=10)["dataset.max_samples"]
    assert refused(request(dataset={"rows": CHAT_ROWS}), max_dataset_rows=6) == {}
    carved = request(dataset={"id": "tiny/chat-rows", "test_split_size": 10**9})  # a count of rows to carve
    assert refused(carved, max_dataset_rows=10) == {
        "dataset.test_split_size": "1000000000 rows; this host allows at most 10 (max_dataset_rows)"
    }
    assert refused(request(dataset={"id": "tiny/chat-rows", "test_split_size": 0.5}), max_dataset_rows=10) == {}


def test_gpus_above_the_maximum_per_job() -> None:
    errors = refused(request(resources={"gpus": 4}), max_gpus_per_job=2)
    assert errors == {"resources.gpus": "4 GPUs; this host allows at most 2 per job (max_gpus_per_job)"}


def test_trackio_logs_to_the_operators_folder_and_nowhere_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Space, server or bucket in the unit's environment would send a job's metrics off the host
    under the daemon's token; the child gets only the operator's folder."""
    from daemon.children.warm import child_environment

    for variable in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_REGISTRY_BUCKET_ID", "TRACKIO_WRITE_TOKEN"):
        monkeypatch.setenv(variable, "someone/else")
    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    env = child_environment(Settings(trackio_dir=Path("/var/lib/adapterd/trackio")))
    assert env["TRACKIO_DIR"] == "/var/lib/adapterd/trackio"
    assert not {name for name in env if name.startswith("TRACKIO_")} - {"TRACKIO_DIR"}
    assert "TRACKIO_DIR" not in child_environment(Settings())


def test_reporting_integrations_need_the_operators_consent() -> None:
    asking = request(training={"max_steps": 2, "report_to": ["tensorboard"]})
    assert "allowed_report_to" in refused(asking)["training.report_to"]
    assert (
        refused(asking, allowed_report_to=["tensorboard"], tensorboard_dir=Path("/var/lib/adapterd/tensorboard")) == {}
    )
    # Allowed, but with nowhere to write on this host: refused, naming the setting.
    assert "tensorboard_dir" in refused(asking, allowed_report_to=["tensorboard"])["training.report_to"]
    mlflow = request(training={"max_steps": 2, "report_to": ["mlflow"]})
    assert "mlflow_tracking_uri" in refused(mlflow, allowed_report_to=["mlflow"])["training.report_to"]
    assert refused(mlflow, allowed_report_to=["mlflow"], mlflow_tracking_uri="http://127.0.0.1:5000") == {}
    trackio = request(training={"max_steps": 2, "report_to": ["trackio"]})
    assert "trackio_dir" in refused(trackio, allowed_report_to=["trackio"])["training.report_to"]
    assert refused(trackio, allowed_report_to=["trackio"], trackio_dir=Path("/var/lib/adapterd/trackio")) == {}
    assert report_to(asking, Settings(report_to=["mlflow"], allowed_report_to=["tensorboard"])) == [
        "mlflow",
        "tensorboard",
    ]
    assert report_to(request(), Settings()) == []


@pytest.mark.parametrize("rule", ["allowed_models", "allowed_datasets", "allowed_output_namespaces"])
def test_every_broken_rule_is_reported_not_only_the_first(rule: str) -> None:
    errors = refused(request(), allowed_models=["x/*"], allowed_datasets=["x/*"], allowed_output_namespaces=["x"])
    assert set(errors) == {"model.id", "dataset.id", "output.repo_id"}
    assert any(rule in message for message in errors.values())


def test_object_storage_is_off_until_a_prefix_allows_it() -> None:
    asking = request(dataset={"url": "s3://ml-data/curated/chat/*.parquet"})
    assert "allowed_dataset_urls: none configured" in refused(asking)["dataset.url"]
    assert refused(asking, allowed_dataset_urls=["s3://ml-data/curated/*"]) == {}
    elsewhere = request(dataset={"files": {"train": ["s3://ml-data/curated/a.parquet", "s3://ml-data/raw/b.parquet"]}})
    assert list(refused(elsewhere, allowed_dataset_urls=["s3://ml-data/curated/*"])) == ["dataset.files.train.1"]


def test_local_files_only_under_an_allowed_root(tmp_path: Path) -> None:
    inside = request(dataset={"url": str(tmp_path / "chat") + "/"})
    assert "none configured" in refused(inside)["dataset.url"]
    assert refused(inside, allowed_local_dataset_roots=[tmp_path]) == {}
    outside = request(dataset={"url": "/etc/*.json"})
    assert (
        "outside allowed_local_dataset_roots" in refused(outside, allowed_local_dataset_roots=[tmp_path])["dataset.url"]
    )
    (tmp_path / "link").symlink_to("/etc")
    through_link = request(dataset={"url": str(tmp_path / "link" / "*.json")})
    assert "dataset.url" in refused(through_link, allowed_local_dataset_roots=[tmp_path])


def test_every_source_of_a_mixture_and_the_eval_set_is_checked(tmp_path: Path) -> None:
    asking = request(
        dataset={
            "mixture": [{"id": "tiny/chat-rows", "proportion": 1}, {"url": "s3://other/x.parquet", "proportion": 1}],
            "eval": {"url": "/srv/eval.jsonl"},
        }
    )
    errors = refused(
        asking,
        allowed_datasets=["approved/*"],
        allowed_dataset_urls=["s3://ml-data/*"],
        allowed_local_dataset_roots=[tmp_path],
    )
    assert set(errors) == {"dataset.mixture.0.id", "dataset.mixture.1.url", "dataset.eval.url"}


def grpo_request(method: str = "grpo", **block: Any) -> RequestBase:
    raw = sft_request(
        "policy-vllm",
        method=method,
        dataset={"rows": PROMPT_ROWS},
        rewards={"functions": [{"name": "think_format"}]},
        **{method: block},
    )
    return REQUEST_MODELS[method].model_validate(raw)


@pytest.mark.parametrize("method", ["grpo", "rloo"])
def test_vllm_server_mode_only_where_the_operator_configured_a_server(method: str) -> None:
    server = grpo_request(method, use_vllm=True, vllm_mode="server")
    errors = refused(server)
    assert errors == {
        f"{method}.vllm_mode": (
            "server: this host has no vLLM server configured (vllm_server_base_url); use vllm_mode 'colocate'"
        )
    }
    assert refused(server, vllm_server_base_url="http://vllm.internal:8000") == {}
    assert refused(grpo_request(method, use_vllm=True, vllm_mode="colocate")) == {}
    assert refused(grpo_request(method, use_vllm=True)) == {}  # TRL's default mode: colocate


@pytest.mark.parametrize("field", ["vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_group_port"])
def test_a_request_never_names_a_vllm_server(field: str) -> None:
    """TRL's fields that say where a vLLM server is are in the refusal table: decode rejects them,
    with the reason and the safe form (the host's own server)."""
    from schemas.decode import Rejection, decode_request

    raw = grpo_request().model_dump(mode="json")
    raw["grpo"] = {
        **raw["grpo"],
        "use_vllm": True,
        "vllm_mode": "server",
        field: 8000 if field.endswith("port") else "10.0.0.9",
    }
    rejection = decode_request(json.dumps(raw).encode())
    assert isinstance(rejection, Rejection) and rejection.reason == "invalid"
    assert [e.path for e in rejection.errors] == [f"grpo.{field}"]
    assert f"trl.GRPOConfig.{field} is refused (a path or address on the host)" in rejection.errors[0].message
    assert "ADAPTERD_VLLM_SERVER_BASE_URL" in rejection.errors[0].message


def test_the_vllm_server_setting_is_a_url() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="vllm_server_base_url"):
        Settings(vllm_server_base_url="vllm.internal:8000")
    assert (
        Settings(vllm_server_base_url="http://vllm.internal:8000/").vllm_server_base_url == "http://vllm.internal:8000"
    )


def test_grpo_completions_go_only_to_an_allowed_namespace() -> None:
    """`grpo.log_completions_hub_repo` is settable, but TRL pushes there with the host's token: it is
    held to allowed_output_namespaces like the result, and a bare name (the token's own namespace) is refused."""
    allowed = {"allowed_output_namespaces": ["results"]}
    assert refused(grpo_request(log_completions_hub_repo="results/completions"), **allowed) == {}
    elsewhere = refused(grpo_request(log_completions_hub_repo="someone-else/completions"), **allowed)
    assert elsewhere == {
        "grpo.log_completions_hub_repo": (
            "namespace someone-else is not allowed on this host (allowed_output_namespaces: ['results'])"
        )
    }
    assert list(refused(grpo_request(log_completions_hub_repo="completions"), **allowed)) == [
        "grpo.log_completions_hub_repo"
    ]
    assert refused(grpo_request(log_completions_hub_repo="anyone/completions")) == {}  # no namespaces set: any


def test_a_request_cannot_set_grpo_reward_weights_beside_each_rewards_weight() -> None:
    from schemas.decode import Rejection, decode_request

    raw = grpo_request().model_dump(mode="json")
    raw["grpo"] = {"reward_weights": [2.0]}
    rejection = decode_request(json.dumps(raw).encode())
    assert isinstance(rejection, Rejection) and [e.path for e in rejection.errors] == ["grpo.reward_weights"]
    assert "rewards.functions[].weight" in rejection.errors[0].message


CLASSES = [{"name": "urgent"}, {"name": "default"}, {"name": "batch", "preemptible": True}]


def test_a_class_the_fleet_has_passes_and_an_unknown_one_is_refused_naming_the_field() -> None:
    assert (
        refused(request(priority_class="batch", team="vision"), priority_classes=CLASSES, **shared_fleet_keys()) == {}
    )
    assert refused(request(), priority_classes=CLASSES, **shared_fleet_keys()) == {}  # absent: the default class
    errors = refused(request(priority_class="asap"), priority_classes=CLASSES, **shared_fleet_keys())
    assert errors == {"priority_class": "unknown class 'asap'; expected one of urgent, default, batch"}
    assert "no priority classes" in refused(request(priority_class="batch"))["priority_class"]


def test_the_default_class_is_the_operators_or_else_the_lowest() -> None:
    assert Settings(priority_classes=CLASSES, **shared_fleet_keys()).default_class == "batch"
    assert Settings(priority_classes=CLASSES, default_priority_class="default", **shared_fleet_keys()).class_topics == {
        "urgent": "adapterd.requests.urgent",
        "default": "adapterd.requests",
        "batch": "adapterd.requests.batch",
    }
    assert Settings().default_class is None and Settings().class_topics == {}
    with pytest.raises(ValueError, match="default_priority_class 'normal' is not one of"):
        Settings(priority_classes=CLASSES, default_priority_class="normal", **shared_fleet_keys())
    with pytest.raises(ValueError, match="each name once"):
        Settings(priority_classes=[{"name": "a"}, {"name": "a"}], **shared_fleet_keys())
