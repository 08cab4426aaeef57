"""`adapterd convert trl-config`: turn the YAML file of a `trl` CLI run (`trl sft --config sft.yaml`)
into an adapterd request, and name each key the request cannot carry with the reason.

A `trl` CLI file is one flat mapping of the keys of four dataclasses: the method's config
(`transformers.TrainingArguments` and the method's own fields, e.g. `trl.SFTConfig`),
`trl.ModelConfig` (the base model and LoRA), and the script's `trl.ScriptArguments` and
`trl.DatasetMixtureConfig` (the dataset); GRPO and RLOO add their reward arguments. Each key goes to
where a request says it: `training`, the method block, `model`, `peft` (`use_peft`; without it
`peft: null`, a full fine-tune, as the `trl` CLI does: trl_model.py), `dataset`, `output` (`hub_model_id`),
`resources` (`num_processes`). Which fields exist, their defaults and the refusals come from the
contract read from the locked TRL (schemas/trl_contract.json, schemas/contract_rules.py); the script
and dataset-mixture arguments, which the contract does not hold, are listed here as trl 1.16 defines
them (trl/scripts/utils.py, grpo.py, rloo.py) in trl_datasets.py and trl_rewards.py. TRL is never
imported. Every key of the file is accounted for in a Ledger (ledger.py). The result is checked by the
same decoder the daemon uses (`schemas.decode_request`) before it is handed back.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from daemon.admission.secret_rules import SCANNER
from daemon.cli.convert.ledger import Conversion, Dropped, Ledger, UsageError, refused, same_value
from daemon.cli.convert.open_r1_config import carry_open_r1
from daemon.cli.convert.trl_datasets import carry_dataset
from daemon.cli.convert.trl_model import carry_model_and_peft
from daemon.cli.convert.trl_renames import carry_renames
from daemon.cli.convert.trl_rewards import REWARD_METHODS, carry_rewards
from schemas import FieldError, Rejection, decode_request
from schemas.common import REQUEST_ID_PATTERN
from schemas.contract_rules import MODEL_CONFIG_PATHS, refusal
from schemas.generated import load_contract
from schemas.request_base import REPO_ID_PATTERN, TrainingSpec
from schemas.typos import closest

# Keys TRL reads only when their strategy is "steps" (TrainingArguments' own rule).
IGNORED_UNLESS_STEPS = (
    ("save_steps", "save_strategy"),
    ("eval_steps", "eval_strategy"),
    ("logging_steps", "logging_strategy"),
)


def convert(config: dict[str, Any], method: str, request_id: str, output_repo: str | None = None) -> Conversion:
    """The request a `trl` CLI config makes for `method`, the keys it does not carry, and its errors."""
    if not re.fullmatch(REQUEST_ID_PATTERN, request_id):
        raise UsageError(f"not a request id: {request_id!r} (letters, digits, '.', '_', '-'; at most 128)")
    if output_repo is not None and not re.fullmatch(REPO_ID_PATTERN, output_repo):
        raise UsageError(f"--output-repo: not a Hub repo 'namespace/name': {output_repo!r}")
    return _Converter(config, method, request_id, output_repo).run()


def _literals(annotation: Any) -> list[str]:
    """The string values of the Literals inside a type (report_to's integrations)."""
    if typing.get_origin(annotation) is typing.Literal:
        return [value for value in typing.get_args(annotation) if isinstance(value, str)]
    return [value for argument in typing.get_args(annotation) for value in _literals(argument)]


class _Converter(Ledger):
    def __init__(self, config: dict[str, Any], method: str, request_id: str, output_repo: str | None) -> None:
        contract = load_contract()
        self.method, self.output_repo = method, output_repo
        self.section = contract[method]
        self.training_fields: dict[str, Any] = contract["training"]["fields"]
        self.method_fields: dict[str, Any] = self.section["fields"]
        self.model_fields: dict[str, Any] = contract["model"]["fields"]
        self.config_class = self.section["source"].rpartition(".")[2]
        super().__init__(config, {"schema_version": 1, "request_id": request_id, "method": method})

    # --- the steps ---

    def run(self) -> Conversion:
        self.drop("env", "environment variables of the trl process; a job runs in the daemon's environment on the host")
        carry_renames(self, self.method, self.request_path)  # an older recipe's keys under the names TRL reads now
        self.ignored_steps()
        carry_model_and_peft(self, self.method, self.model_fields)
        carry_dataset(self)
        if self.method in REWARD_METHODS:
            carry_rewards(self)
        carry_open_r1(self)  # open-r1's own config keys, its branch to push to among them: before the output
        self.output()
        self.blocks()
        for key in self.config:
            if key not in self.taken:
                self.unknown(key)
        order = {key: index for index, key in enumerate(self.config)}
        self.dropped.sort(key=lambda dropped: order.get(dropped.key.split(".")[0], len(order)))  # in the file's order
        return self.checked()

    def ignored_steps(self) -> None:
        """A `*_steps` key that TRL reads only under its strategy 'steps': under another strategy TRL
        ignores it, and carrying it would change the training (the daemon saves by steps, whatever the
        recipe's save_strategy: a leftover `save_steps: 1` would save every step)."""
        for steps, strategy in IGNORED_UNLESS_STEPS:
            chosen = self.config.get(strategy, self.training_fields.get(strategy, {}).get("default"))
            if self.has(steps) and chosen != "steps":
                self.drop(
                    steps,
                    f"ignored by TRL under {strategy} {chosen!r}"
                    + (
                        "; the daemon saves every training.save_steps (transformers' 500 when unset)"
                        if steps == "save_steps"
                        else ""
                    ),
                )

    def output(self) -> None:
        hub_model_id = self.get("hub_model_id")
        if self.output_repo is not None:
            self.put("output.repo_id", self.output_repo, "--output-repo")
            if hub_model_id is not None and hub_model_id != self.output_repo:
                self.dropped.append(Dropped("hub_model_id", "already said by output.repo_id (--output-repo)"))
        elif isinstance(hub_model_id, str) and "/" in hub_model_id:
            self.put("output.repo_id", hub_model_id, "hub_model_id")
        elif hub_model_id is not None:
            self.error(
                "output.repo_id", f"hub_model_id {hub_model_id!r} has no namespace; give --output-repo NAMESPACE/NAME"
            )
        else:
            self.error("output.repo_id", "the file has no hub_model_id; give --output-repo NAMESPACE/NAME")
        if self.get("hub_private_repo") is not None:
            self.put("output.private", self.config["hub_private_repo"], "hub_private_repo")
        if self.get("hub_revision") is not None:
            self.put("output.revision", self.config["hub_revision"], "hub_revision")
        if self.has("num_processes"):
            self.put("resources.gpus", self.get("num_processes"), "num_processes")
        self.drop(
            "accelerate_config", refused("training", "local_rank", "accelerate_config")
        )  # the daemon launches the processes

    def blocks(self) -> None:
        """TrainingArguments keys to `training`, the method's own config keys to its block."""
        training_defaults = self.section.get("training_defaults", {})
        for key in list(self.config):
            if key in self.taken:
                continue
            if key in self.training_fields:
                field = self.training_fields[key]
                self.block_field("training", key, training_defaults.get(key, field["default"]), field["type"])
            elif key in self.method_fields:
                self.block_field(self.method, key, self.method_fields[key]["default"], self.method_fields[key]["type"])

    def block_field(self, block: str, key: str, default: Any, kind: str) -> None:
        value = _as_trl_reads(self.get(key), kind)
        if key == "trust_remote_code":
            if value:
                self.put("model.trust_remote_code", value, key)
            return
        if key == "reward_model_path" and block == "ppo":
            self.put("reward_model", {"id": value}, key)
            return
        if key == "report_to":
            self.report_to(value)
            return
        if refusal(block, key) is not None:
            self.drop(key, refused(block, key), default)
        elif not same_value(value, default):
            self.put(f"{block}.{key}", value, key)
        else:
            self.defaulted[key] = value

    def report_to(self, value: Any) -> None:
        allowed = _literals(TrainingSpec.model_fields["report_to"].annotation)
        names = [value] if isinstance(value, str) else list(value or [])
        names = [name for name in names if name != "none"]
        carried = [name for name in names if name in allowed]
        for name in names:
            if name == "all":
                self.dropped.append(
                    Dropped(
                        "report_to",
                        f"all: every integration installed on the host; a request names them ({', '.join(allowed)})",
                    )
                )
            elif name not in allowed:
                self.dropped.append(
                    Dropped("report_to", f"{name}: not an integration a request may turn on ({', '.join(allowed)})")
                )
        if carried:
            self.put("training.report_to", carried, "report_to")

    def request_path(self, key: str) -> str:
        """Where a key of today's file goes in the request (for an error about it)."""
        if key in MODEL_CONFIG_PATHS:
            return MODEL_CONFIG_PATHS[key]
        return f"training.{key}" if key in self.training_fields else f"{self.method}.{key}"

    def unknown(self, key: str) -> None:
        """A key no config of this TRL has: a typo of one it has is an error naming that one (leaving
        it out would train with the default the file meant to change); any other is left out, named."""
        version = f"{self.section['package']} {self.section['version']}"
        known = [*self.training_fields, *self.method_fields, *self.model_fields, *MODEL_CONFIG_PATHS]
        meant = closest(key, known)
        if meant:
            why = self.misspelled[key] = f"unknown to {version}'s {self.config_class}; did you mean {meant!r}?"
            self.errors.append(FieldError(path=self.request_path(meant), message=f"the file's key {key!r} is {why}"))
            return
        self.dropped.append(
            Dropped(
                key,
                f"unknown to {version}'s {self.config_class}, ModelConfig and script arguments "
                "(trl's CLI passes such keys to `accelerate launch`)",
            )
        )

    # --- the check ---

    def checked(self) -> Conversion:
        """The request through the daemon's own decoder; the converter's errors first, then the
        schema's on fields those do not already name."""
        carried: dict[str, list[str]] = {}
        for path, key in self.origin.items():
            carried.setdefault(key, []).append(path)
        conversion = Conversion(
            renamed=self.renamed,
            dropped=self.dropped,
            errors=list(self.errors),
            changed=self.changed,
            carried=carried,
            defaulted=self.defaulted,
            misspelled=self.misspelled,
            noted=self.noted,
        )
        decoded = decode_request(json.dumps(self.request).encode(), scanner=SCANNER)
        if isinstance(decoded, Rejection):
            named = [error.path for error in self.errors]
            conversion.errors += [
                FieldError(path=error.path, message=self.annotated(error))
                for error in decoded.errors
                if not any(_within(error.path, path) or _within(path, error.path) for path in named)
            ]
        elif not self.errors:
            conversion.request = decoded
        return conversion

    def annotated(self, error: FieldError) -> str:
        """The schema's message, and the key of the file the field came from (or the key that would give it)."""
        path = error.path
        while path:
            if path in self.origin:
                return f"{error.message} (from {self.origin[path]})"
            path = path.rpartition(".")[0]
        needs = {
            "model": "model_name_or_path",
            "dataset": "dataset_name or datasets",
            "output": "hub_model_id NAMESPACE/NAME or --output-repo",
            "rewards": "reward_funcs or reward_model_name_or_path",
            "reward_model": "reward_model_path",
        }
        top = error.path.split(".")[0]
        return f"{error.message} (set {needs[top]})" if top in needs else error.message


def _as_trl_reads(value: Any, kind: str) -> Any:
    """A number the YAML file gives as a string (PyYAML reads `2.0e-4` as one) as the number trl's
    CLI makes of it: its parser hands a file's values to argparse, which converts a string by the
    field's type. A request is strict (schemas/decode.py): it says the number."""
    if isinstance(value, str) and kind in ("int", "float"):
        try:
            return int(value) if kind == "int" else float(value)
        except ValueError:
            return value  # not a number: the decoder names the field
    return value


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")
