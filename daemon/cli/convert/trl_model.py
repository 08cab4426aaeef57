"""trl.ModelConfig's keys of a `trl` CLI file into the request's `model` and `peft`: the base model,
its revision, dtype and quantization, and LoRA when the file sets use_peft (without it `peft: null`,
a full fine-tune, as the `trl` CLI does). Where adapterd's default differs from the `trl` CLI's, the
request states trl's."""

from __future__ import annotations

from typing import Any

from daemon.cli.convert.ledger import Ledger, refused
from schemas.contract_rules import MODEL_CONFIG_PATHS

# trl.ModelConfig's defaults (trl 1.16) for the keys a request says elsewhere (MODEL_CONFIG_PATHS);
# the contract's `model` section holds the rest of ModelConfig.
MODEL_CLI_DEFAULTS: dict[str, Any] = {
    "model_name_or_path": None,
    "model_revision": "main",
    "dtype": "float32",
    "load_in_4bit": False,
    "load_in_8bit": False,
    "use_peft": False,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "lora_target_modules": None,
    "lora_target_parameters": None,
    "lora_modules_to_save": None,
    "lora_task_type": "CAUSAL_LM",
    "use_rslora": False,
    "use_dora": False,
}


def carry_model_and_peft(keys: Ledger, method: str, model_fields: dict[str, Any]) -> None:
    """The file's ModelConfig keys into `model` (and `model_fields`, the contract's rest of ModelConfig)
    and, with use_peft, `peft`; without it the LoRA keys are left out, named, and `peft` is null."""
    if keys.has("model_name_or_path"):
        keys.put("model.id", keys.get("model_name_or_path"), "model_name_or_path")
    if keys.has("model_revision"):
        keys.put("model.revision", keys.get("model_revision"), "model_revision")
    # trl's CLI loads the base in float32 unless the file says otherwise; adapterd's default is "auto".
    dtype = keys.get("dtype", MODEL_CLI_DEFAULTS["dtype"])
    keys.put("model.dtype", "auto" if dtype is None else dtype, "dtype")
    four, eight = bool(keys.get("load_in_4bit", False)), bool(keys.get("load_in_8bit", False))
    if four and eight:
        keys.error("model.quantization", "load_in_4bit and load_in_8bit are both set; trl refuses that too")
    elif four or eight:
        keys.put("model.quantization", "4bit" if four else "8bit", "load_in_4bit" if four else "load_in_8bit")
    for name in model_fields:
        if keys.has(name):
            keys.put(f"model.{name}", keys.get(name), name)
    if keys.has("chat_template"):
        # The alignment-handbook's and open-r1's script argument: an inline Jinja template, as model.chat_template is.
        keys.put("model.chat_template", keys.get("chat_template"), "chat_template")
    if four and not keys.has("use_bnb_nested_quant"):
        keys.put("model.use_bnb_nested_quant", False, "use_bnb_nested_quant")  # trl's default; adapterd's is True

    lora_keys = [key for key, path in MODEL_CONFIG_PATHS.items() if path.startswith("peft.")]
    if not keys.get("use_peft", False):
        keys.request["peft"] = None
        for key in lora_keys:
            keys.drop(
                key, "unused: use_peft is not set, so trl trains the whole model (peft: null)", MODEL_CLI_DEFAULTS[key]
            )
        return
    keys.request["peft"] = {}
    # Without lora_target_modules trl leaves the choice to PEFT (per architecture); adapterd's default is all-linear.
    targets = keys.get("lora_target_modules")
    keys.put("peft.target_modules", "all-linear" if targets == ["all-linear"] else targets, "lora_target_modules")
    task_type = "SEQ_CLS" if method == "reward" else "CAUSAL_LM"
    if keys.get("lora_task_type", task_type) != task_type:
        keys.drop("lora_task_type", refused("peft", "task_type", "lora_task_type"))
    for key in lora_keys:
        if key not in ("lora_target_modules", "lora_task_type") and keys.has(key):
            keys.put(MODEL_CONFIG_PATHS[key], keys.get(key), key)
