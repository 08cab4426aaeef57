"""Fields of TRL, transformers and PEFT that a request could not set before its blocks were generated
from them: they reach the trainer, and a job that sets twenty of them trains end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.data import CHAT_ROWS, TINY_MODEL
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import download, sft_request

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Twenty-one fields that schema version 1 refused as unknown until its blocks were generated.
WIDE: dict[str, Any] = {
    "model": {"attn_implementation": "eager", "chat_template": TEMPLATE},
    "peft": {
        "r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "target_modules": ATTENTION,
        "bias": "lora_only",
        "init_lora_weights": "gaussian",
        "rank_pattern": {"q_proj": 8},
        "alpha_pattern": {"q_proj": 16},
        "layers_to_transform": [1],
        "exclude_modules": ["down_proj"],
        "modules_to_save": ["lm_head"],
    },
    "training": {
        "max_steps": 4,
        "learning_rate": 1e-2,
        "per_device_train_batch_size": 2,
        "optim": "sgd",
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr": 1e-3},
        "eval_strategy": "steps",
        "eval_steps": 2,
        "save_steps": 2,
        "load_best_model_at_end": True,
        "metric_for_best_model": "eval_loss",
        "greater_is_better": False,
        "neftune_noise_alpha": 5.0,
        "fp16": False,
        "tf32": False,
        "adam_beta2": 0.99,
    },
    "sft": {"max_length": 64, "packing": True, "packing_strategy": "wrapped", "loss_type": "dft"},
}
FORMERLY_REFUSED = {
    "model": ["attn_implementation", "chat_template"],
    "peft": [
        "bias",
        "init_lora_weights",
        "rank_pattern",
        "alpha_pattern",
        "layers_to_transform",
        "exclude_modules",
        "modules_to_save",
    ],
    "training": [
        "optim",
        "lr_scheduler_kwargs",
        "load_best_model_at_end",
        "metric_for_best_model",
        "greater_is_better",
        "neftune_noise_alpha",
        "fp16",
        "tf32",
        "adam_beta2",
    ],
    "sft": ["packing_strategy", "loss_type"],
}


def wide_request(request_id: str, dataset: dict[str, Any]) -> dict[str, Any]:
    request = sft_request(request_id, dataset=dataset, **WIDE)
    request["model"] = {"id": TINY_MODEL, **WIDE["model"]}
    return request


def test_twenty_formerly_refused_fields_are_in_the_request() -> None:
    from schemas.request import SFTRequest

    request = SFTRequest.model_validate(wide_request("wide", {"rows": CHAT_ROWS}))
    assert sum(len(names) for names in FORMERLY_REFUSED.values()) >= 20
    for block, names in FORMERLY_REFUSED.items():
        assert set(names) <= set(getattr(request, block).model_fields_set), block


def test_the_generated_fields_reach_trls_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    from trl import GRPOConfig, SFTConfig

    from handlers.protocol import JobSpec
    from handlers.toolkit.training import lora_config, trl_config
    from schemas.request import GRPORequest, SFTRequest

    raw = wide_request("wide", {"rows": CHAT_ROWS})
    job = JobSpec(
        request=raw, checkpoints=tmp_path / "checkpoints", artifact=tmp_path / "artifact", progress_interval_s=0
    )
    config = trl_config(SFTConfig, SFTRequest.model_validate(raw), job, "sft")
    assert (config.optim, config.lr_scheduler_type, config.lr_scheduler_kwargs) == (
        "sgd",
        "cosine_with_min_lr",
        {"min_lr": 1e-3},
    )
    assert (config.neftune_noise_alpha, config.load_best_model_at_end, config.adam_beta2) == (5.0, True, 0.99)
    assert (config.packing_strategy, config.loss_type, config.max_length) == ("wrapped", "dft", 64)
    assert config.output_dir == str(tmp_path / "checkpoints") and config.save_total_limit == 2  # the daemon's own
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = lora_config(SFTRequest.model_validate(raw).peft, "CAUSAL_LM", model)
    # rank_pattern's key is matched by adapterd (handlers/toolkit/lora_patterns.py): PEFT gets
    # each module it names, escaped.
    q_projs = {re.escape(name): 8 for name, _ in model.named_modules() if name.endswith(".q_proj")}
    assert len(q_projs) == 2
    assert (lora.bias, lora.init_lora_weights, lora.rank_pattern, lora.layers_to_transform) == (
        "lora_only",
        "gaussian",
        q_projs,
        [1],
    )

    grpo = {
        "num_generations": 2,
        "max_completion_length": 8,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "generation_batch_size": 4,
        "epsilon_high": 0.28,
        "importance_sampling_level": "sequence",
        "mask_truncated_completions": True,
        "loss_type": "cispo",
    }
    request = GRPORequest.model_validate(
        {
            **sft_request("grpo-wide"),
            "method": "grpo",
            "dataset": {"rows": [{"prompt": "a"}]},
            "grpo": grpo,
            "rewards": {"functions": [{"name": "length_penalty", "target_chars": 10}]},
        }
    )
    built = trl_config(GRPOConfig, request, job, "grpo")
    assert {name: getattr(built, name) for name in grpo} == grpo


@pytest.mark.slow
async def test_a_job_setting_twenty_formerly_refused_fields_trains_end_to_end(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tmp_path: Path
) -> None:
    import torch

    request = wide_request("sft-wide", {"rows": CHAT_ROWS, "eval": {"rows": CHAT_ROWS[:4]}})
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    pushed = download(published.endpoint, "results/sft-wide", done.commit_sha, tmp_path / "pushed")
    adapter = json.loads((pushed / "adapter_config.json").read_text())
    # The patterns' keys reach PEFT as the modules adapterd matched them to
    # (handlers/toolkit/lora_patterns.py), escaped.
    patterns = {"rank_pattern", "alpha_pattern"}
    assert {key: adapter[key] for key in FORMERLY_REFUSED["peft"] if key not in patterns} == {
        key: WIDE["peft"][key] for key in FORMERLY_REFUSED["peft"] if key not in patterns
    }
    for key in patterns & set(FORMERLY_REFUSED["peft"]):
        [(pattern, value)] = WIDE["peft"][key].items()
        assert adapter[key] == {re.escape(f"model.layers.{layer}.self_attn.{pattern}"): value for layer in (0, 1)}, key
    assert (
        json.loads((pushed / "tokenizer_config.json").read_text()).get(
            "chat_template", (pushed / "chat_template.jinja").read_text()
        )
        == TEMPLATE
    )
    # What the trainer ran with, from the job's last checkpoint: the training and sft fields as sent.
    checkpoint = max(
        (shared_settings.jobs_dir / "sft-wide" / "checkpoints").glob("checkpoint-*"),
        key=lambda p: int(p.name.split("-")[1]),
    )
    args = torch.load(checkpoint / "training_args.bin", weights_only=False)
    for block in ("training", "sft"):
        for name in FORMERLY_REFUSED.get(block, []):
            assert getattr(args, name) == WIDE[block][name], name
    assert done.metrics["eval_loss"] > 0
