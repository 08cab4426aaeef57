import json
import math
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from daemon.cli.demo.requests import PREFERENCE_ROWS
from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.data import HUB_TOKEN, PREFERENCE_DATASET, TINY_MODEL
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import SMALL_TRAINING, assert_adapter_trained, download, example_request, other_model, run_handler

# At the first step a LoRA policy is its base (B starts at zero), so against the base as reference the
# sigmoid loss is exactly log 2; against another reference it is not.
SAME_AS_POLICY = math.log(2)


@pytest.mark.slow
async def test_dpo_on_a_hub_dataset_with_mapped_columns_an_eval_split_and_a_hub_ref_model(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request(
        "dpo",
        "dpo-e2e",
        dataset={
            "id": PREFERENCE_DATASET,
            "columns": {"question": "prompt", "good": "chosen", "bad": "rejected"},
            "eval_split": "test",
            "max_samples": 3,
        },
        training={**SMALL_TRAINING, "eval_strategy": "steps", "eval_steps": 2},
        ref_model={"id": TINY_MODEL},  # the base's own Hub repo: the reference is loaded beside the LoRA policy
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("dpo", "trl.DPOTrainer/trl.DPOConfig")
    sha = HfApi(endpoint=published.endpoint, token=HUB_TOKEN).model_info(TINY_MODEL).sha
    assert (done.ref_model, done.ref_model_revision) == (TINY_MODEL, sha) and done.base_model_revision == sha
    assert done.metrics["first_loss"] == pytest.approx(SAME_AS_POLICY, abs=1e-4)  # a reference with the base's weights
    commit = published.commits("results/dpo-e2e")[0]
    assert "- dpo" in commit.files["README.md"].decode()
    assert_adapter_trained(download(published.endpoint, "results/dpo-e2e", done.commit_sha, tmp_path), tiny_model_dir)


def dpo_request(request_id: str, tiny_model_dir: Path, **overrides: object) -> dict[str, object]:
    return example_request(
        "dpo", request_id, model={"id": str(tiny_model_dir)}, dataset={"rows": PREFERENCE_ROWS}, **overrides
    )


@pytest.mark.slow
def test_dpo_with_precomputed_reference_log_probs_from_another_ref_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    reference = other_model(tiny_model_dir, tmp_path / "reference")
    precompute = {"beta": 0.1, "precompute_ref_log_probs": True}

    done, _ = run_handler(
        dpo_request("dpo-ref-pre", tiny_model_dir, dpo=precompute, ref_model={"id": str(reference)}), tmp_path / "ref"
    )
    assert done.trainer == "trl.DPOTrainer/trl.DPOConfig", done
    assert done.ref_model_revision is None  # a local folder
    assert done.metrics["first_loss"] != pytest.approx(
        SAME_AS_POLICY, abs=1e-3
    )  # the loss compared the policy with the other model
    assert_adapter_trained(tmp_path / "ref" / "artifact", tiny_model_dir)

    # The same reference, its log-probs computed at each step instead: the same first loss.
    live, _ = run_handler(
        dpo_request("dpo-ref-live", tiny_model_dir, dpo={"beta": 0.1}, ref_model={"id": str(reference)}),
        tmp_path / "live",
    )
    assert live.metrics["first_loss"] == pytest.approx(done.metrics["first_loss"], abs=1e-4)

    base, _ = run_handler(dpo_request("dpo-base-pre", tiny_model_dir, dpo=precompute), tmp_path / "base")
    assert base.metrics["first_loss"] == pytest.approx(SAME_AS_POLICY, abs=1e-4)


def test_a_ref_model_without_the_base_tokenizers_tokens_fails_to_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    small = other_model(tiny_model_dir, tmp_path / "small-vocab", vocab_size=64)
    failure, sent = run_handler(
        dpo_request("dpo-ref-vocab", tiny_model_dir, ref_model={"id": str(small)}), tmp_path / "job"
    )
    assert (failure.code, failure.stage) == ("model_unavailable", "load_model"), failure
    assert (
        failure.message.startswith(f"ref_model.id: {small} has 64 token embeddings")
        and "share the base model's tokenizer" in failure.message
    )
    assert [m["stage"] for m in sent if m["kind"] == "stage"] == ["load_dataset", "load_model"]


def test_precomputed_reference_log_probs_need_a_dataset_that_is_not_a_stream() -> None:
    from schemas import decode_request

    for method in ("dpo", "kto"):
        raw = example_request(
            method,
            f"{method}-stream",
            dataset={"url": "s3://data/rows/*.parquet", "streaming": True},
            **{method: {"precompute_ref_log_probs": True}},
        )
        rejection = decode_request(json.dumps(raw).encode())
        [error] = rejection.errors  # type: ignore[union-attr]
        assert error.path == f"{method}.precompute_ref_log_probs" and "streaming dataset" in error.message
