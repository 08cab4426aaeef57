"""`adapterd convert trl-config`: turn the YAML file of a `trl` CLI run (`trl sft --config sft.yaml`)
into an adapterd request, and name each key the request cannot carry with the reason.

A `trl` CLI file is one flat mapping of the keys of four dataclasses: the method's config
(`transformers.TrainingArguments` and the method's own fields, e.g. `trl.SFTConfig`),
`trl.ModelConfig` (the base model and LoRA), and the script's `trl.ScriptArguments` and
`trl.DatasetMixtureConfig` (the dataset); GRPO and RLOO add their reward arguments. Each key goes to
where a request says it: `training`, the method block, `model`, `peft` (`use_peft`; without it
`peft: null`, a full fine-tune, as the `trl` CLI does), `dataset`, `output` (`hub_model_id`),
`resources` (`num_processes`). Which fields exist, their defaults and the refusals come from the
contract read from the locked TRL (schemas/trl_contract.json, schemas/contract_rules.py); the script
and dataset-mixture arguments, which the contract does not hold, are listed here as trl 1.16 defines
them (trl/scripts/utils.py, grpo.py, rloo.py). TRL is never imported. The result is checked by the
same decoder the daemon uses (`schemas.decode_request`) before it is handed back.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.admission.secret_rules import SCANNER
from schemas import FieldError, Rejection, RequestBase, decode_request
from schemas.common import REQUEST_ID_PATTERN
from schemas.contract_render import load_contract
from schemas.contract_rules import MODEL_CONFIG_PATHS, refusal
from schemas.methods import METHODS
from schemas.request_base import REPO_ID_PATTERN, TrainingSpec

# trl.ModelConfig's defaults (trl 1.16) for the keys a request says elsewhere (MODEL_CONFIG_PATHS);
# the contract's `model` section holds the rest of ModelConfig.
MODEL_CLI_DEFAULTS: dict[str, Any] = {
    "model_name_or_path": None, "model_revision": "main", "dtype": "float32", "load_in_4bit": False, "load_in_8bit": False,
    "use_peft": False, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None,
    "lora_target_parameters": None, "lora_modules_to_save": None, "lora_task_type": "CAUSAL_LM", "use_rslora": False,
    "use_dora": False,
}
# trl.ScriptArguments (every script), trl.DatasetMixtureConfig (the `datasets:` mixture) and the
# reward arguments of the grpo and rloo scripts, with their defaults.
SCRIPT_DEFAULTS: dict[str, Any] = {
    "dataset_name": None, "dataset_config": None, "dataset_train_split": "train", "dataset_test_split": "test",
    "dataset_streaming": False, "ignore_bias_buffers": False,
}
MIXTURE_DEFAULTS: dict[str, Any] = {"datasets": [], "streaming": False, "test_split_size": None}
REWARD_DEFAULTS: dict[str, Any] = {"reward_model_name_or_path": None, "reward_funcs": None}
REWARD_METHODS = ("grpo", "rloo")
# trl's reward functions that adapterd ships under its own name.
REWARD_FUNCTIONS = {"think_format_reward": "think_format"}
# datasets' packaged builders a `datasets:` entry may name as its `path`, with the files in `data_files`.
FILE_BUILDERS = {"json": "json", "csv": "csv", "parquet": "parquet", "arrow": "arrow"}
OTHER_BUILDERS = {"text", "pandas", "xml", "sql", "generator", "spark", "hdf5", "imagefolder", "audiofolder", "videofolder", "webdataset"}
DATASET_CONFIG_KEYS = ("path", "name", "data_dir", "data_files", "split", "columns", "fraction")
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _refused(block: str, field: str, key: str | None = None) -> str:
    """The refusal table's reason for a block's field, said of the file's key: "set by the daemon: ..."."""
    why = refusal(block, field)
    assert why is not None, f"{block}.{field} is not in the refusal table"
    return why.message(key or field).split(": ", 1)[1]


class UsageError(Exception):
    """The command line or the file cannot be used at all (exit 2)."""


@dataclass(frozen=True)
class Dropped:
    """A key of the file the request does not carry, and why."""

    key: str
    why: str

    def line(self) -> str:
        return f"{self.key}: {self.why}"


@dataclass
class Conversion:
    """The request (validated; None when it is not valid), the keys left out, and why the request is not valid."""

    request: RequestBase | None = None
    dropped: list[Dropped] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)


def read_trl_config(path: Path) -> dict[str, Any]:
    """The file's mapping, as `trl`'s parser reads it (`yaml.safe_load`)."""
    import yaml  # only this command reads YAML

    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read it as YAML: {exc}") from exc
    if not isinstance(config, dict) or not all(isinstance(key, str) for key in config):
        raise UsageError(f"{path}: a trl config file is one YAML mapping of option names to values")
    return config


def method_for(path: Path, method: str | None) -> str:
    """--method, else the method the file's name starts with (sft.yaml, dpo-lora.yaml)."""
    known = ", ".join(METHODS)
    if method is not None:
        if method not in METHODS:
            raise UsageError(f"unknown method {method!r}; known methods: {known}")
        return method
    stem = path.name.split(".")[0]
    first = re.split(r"[-_]", stem)[0]
    for candidate in (stem, first):
        if candidate in METHODS:
            return candidate
    raise UsageError(f"{path.name} does not name a method; give --method ({known})")


def default_request_id(path: Path, now: str) -> str:
    """The file's stem and the time: a new run each conversion (the same id would be answered as a duplicate)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.name.split(".")[0]).strip("-.") or "trl"
    return f"{stem[:100]}-{now}"


def convert(config: dict[str, Any], method: str, request_id: str, output_repo: str | None = None) -> Conversion:
    """The request a `trl` CLI config makes for `method`, the keys it does not carry, and its errors."""
    if not re.fullmatch(REQUEST_ID_PATTERN, request_id):
        raise UsageError(f"not a request id: {request_id!r} (letters, digits, '.', '_', '-'; at most 128)")
    if output_repo is not None and not re.fullmatch(REPO_ID_PATTERN, output_repo):
        raise UsageError(f"--output-repo: not a Hub repo 'namespace/name': {output_repo!r}")
    return _Converter(config, method, request_id, output_repo).run()


def _same(value: Any, default: Any) -> bool:
    """Whether a value from the file is the default (YAML reads 2e-5 as a string, trl's parser as a float)."""
    if isinstance(default, list) and not isinstance(value, list):
        value = [value]
    if isinstance(value, str) and isinstance(default, int | float) and not isinstance(default, bool):
        try:
            value = float(value)
        except ValueError:
            return False
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return bool(value == default)


def _literals(annotation: Any) -> list[str]:
    """The string values of the Literals inside a type (report_to's integrations)."""
    if typing.get_origin(annotation) is typing.Literal:
        return [value for value in typing.get_args(annotation) if isinstance(value, str)]
    return [value for argument in typing.get_args(annotation) for value in _literals(argument)]


class _Converter:
    def __init__(self, config: dict[str, Any], method: str, request_id: str, output_repo: str | None) -> None:
        contract = load_contract()
        self.config, self.method, self.output_repo = config, method, output_repo
        self.section = contract[method]
        self.training_fields: dict[str, Any] = contract["training"]["fields"]
        self.method_fields: dict[str, Any] = self.section["fields"]
        self.model_fields: dict[str, Any] = contract["model"]["fields"]
        self.config_class = self.section["source"].rpartition(".")[2]
        self.request: dict[str, Any] = {"schema_version": 1, "request_id": request_id, "method": method}
        self.origin: dict[str, str] = {}  # request path → the key of the file it came from
        self.dropped: list[Dropped] = []
        self.errors: list[FieldError] = []
        self.taken: set[str] = set()

    # --- bookkeeping ---

    def has(self, key: str) -> bool:
        return key in self.config

    def get(self, key: str, default: Any = None) -> Any:
        self.taken.add(key)
        return self.config.get(key, default)

    def put(self, path: str, value: Any, key: str) -> None:
        *blocks, name = path.split(".")
        target = self.request
        for block in blocks:
            target = target.setdefault(block, {})
        target[name] = value
        self.origin[path] = key

    def drop(self, key: str, why: str, default: Any = None) -> None:
        """Leave a key out: named with why, unless its value is the default (nothing is lost)."""
        self.taken.add(key)
        if key in self.config and not _same(self.config[key], default):
            self.dropped.append(Dropped(key, why))

    def error(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path=path, message=message))

    # --- the steps ---

    def run(self) -> Conversion:
        self.drop("env", "environment variables of the trl process; a job runs in the daemon's environment on the host")
        self.model_and_peft()
        self.dataset()
        if self.method in REWARD_METHODS:
            self.rewards()
        self.output()
        self.blocks()
        for key in self.config:
            if key not in self.taken:
                self.unknown(key)
        order = {key: index for index, key in enumerate(self.config)}
        self.dropped.sort(key=lambda dropped: order.get(dropped.key.split(".")[0], len(order)))  # in the file's order
        return self.checked()

    def model_and_peft(self) -> None:
        if self.has("model_name_or_path"):
            self.put("model.id", self.get("model_name_or_path"), "model_name_or_path")
        if self.has("model_revision"):
            self.put("model.revision", self.get("model_revision"), "model_revision")
        # trl's CLI loads the base in float32 unless the file says otherwise; adapterd's default is "auto".
        dtype = self.get("dtype", MODEL_CLI_DEFAULTS["dtype"])
        self.put("model.dtype", "auto" if dtype is None else dtype, "dtype")
        four, eight = bool(self.get("load_in_4bit", False)), bool(self.get("load_in_8bit", False))
        if four and eight:
            self.error("model.quantization", "load_in_4bit and load_in_8bit are both set; trl refuses that too")
        elif four or eight:
            self.put("model.quantization", "4bit" if four else "8bit", "load_in_4bit" if four else "load_in_8bit")
        for name in self.model_fields:
            if self.has(name):
                self.put(f"model.{name}", self.get(name), name)
        if four and not self.has("use_bnb_nested_quant"):
            self.put("model.use_bnb_nested_quant", False, "use_bnb_nested_quant")  # trl's default; adapterd's is True

        lora_keys = [key for key, path in MODEL_CONFIG_PATHS.items() if path.startswith("peft.")]
        if not self.get("use_peft", False):
            self.request["peft"] = None
            for key in lora_keys:
                self.drop(key, "unused: use_peft is not set, so trl trains the whole model (peft: null)", MODEL_CLI_DEFAULTS[key])
            return
        self.request["peft"] = {}
        # Without lora_target_modules trl leaves the choice to PEFT (per architecture); adapterd's default is all-linear.
        targets = self.get("lora_target_modules")
        self.put("peft.target_modules", "all-linear" if targets == ["all-linear"] else targets, "lora_target_modules")
        task_type = "SEQ_CLS" if self.method == "reward" else "CAUSAL_LM"
        if self.get("lora_task_type", task_type) != task_type:
            self.drop("lora_task_type", _refused("peft", "task_type", "lora_task_type"))
        for key in lora_keys:
            if key not in ("lora_target_modules", "lora_task_type") and self.has(key):
                self.put(MODEL_CONFIG_PATHS[key], self.get(key), key)

    def dataset(self) -> None:
        mixture = self.get("datasets") or []
        streaming_key = "streaming" if mixture else "dataset_streaming"
        if mixture:
            for key in ("dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming"):
                self.drop(key, "ignored by the trl CLI when `datasets` is given", SCRIPT_DEFAULTS[key])
            self.mixture(mixture if isinstance(mixture, list) else [mixture])
        else:
            self.drop("streaming", "unused: it streams a `datasets` mixture; dataset_streaming streams dataset_name", False)
            self.drop("test_split_size", "unused: it splits a `datasets` mixture", None)
            source = _source(self.get("dataset_name")) if self.has("dataset_name") else None
            if isinstance(source, str):
                self.error("dataset", f"dataset_name: {source}")
            elif source is not None:
                self.put("dataset", source, "dataset_name")
                if self.has("dataset_config"):
                    self.put("dataset.config", self.get("dataset_config"), "dataset_config")
                if self.has("dataset_train_split"):
                    self.put("dataset.split", self.get("dataset_train_split"), "dataset_train_split")
        if self.get(streaming_key, False) and "dataset" in self.request:
            self.put("dataset.streaming", True, streaming_key)
        self.drop("ignore_bias_buffers", "a DDP workaround of trl's dpo script; adapterd's trainers have no such switch", False)
        # trl evaluates on dataset_test_split whenever eval_strategy is not "no".
        evaluates = self.config.get("eval_strategy", "no") not in ("no", None)
        if evaluates and not mixture and "dataset" in self.request:
            self.put("dataset.eval_split", self.get("dataset_test_split", SCRIPT_DEFAULTS["dataset_test_split"]), "dataset_test_split")
        elif not mixture:
            self.drop("dataset_test_split", "unused: eval_strategy is 'no', so trl evaluates nothing", SCRIPT_DEFAULTS["dataset_test_split"])
        if evaluates and "eval_split" not in self.request.get("dataset", {}):
            self.drop("eval_strategy", "no eval set was carried (adapterd does not split a set: give dataset.eval or dataset.eval_split)", "no")

    def mixture(self, entries: list[Any]) -> None:
        self.drop("test_split_size", "adapterd does not split a set into train and test; give an eval set as dataset.eval or dataset.eval_split", None)
        sources = []
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or "path" not in entry:
                self.error(f"dataset.mixture.{index}", f"datasets.{index}: a dataset entry is a mapping with a `path`")
                continue
            source = _source(entry["path"], entry.get("data_files"))
            if isinstance(source, str):
                self.error(f"dataset.mixture.{index}", f"datasets.{index}.path: {source}")
                continue
            if entry.get("name") is not None:
                source["config"] = entry["name"]
            if entry.get("split") is not None:
                source["split"] = entry["split"]
            if entry.get("fraction") is not None:
                source["proportion"] = entry["fraction"]
            for key in entry:
                if key == "data_dir" and entry[key] is not None:
                    self.dropped.append(Dropped(f"datasets.{index}.data_dir", "a request names a Hub dataset's files in data_files; give data_files inside that folder"))
                elif key == "columns" and entry[key] is not None:
                    self.dropped.append(Dropped(f"datasets.{index}.columns", "adapterd's dataset.columns renames columns, it does not select them; the method reads the columns it needs"))
                elif key not in DATASET_CONFIG_KEYS:
                    self.dropped.append(Dropped(f"datasets.{index}.{key}", "unknown to trl's DatasetConfig"))
            sources.append(source)
        if len(sources) != len(entries):
            return
        if len(sources) == 1:
            sources[0].pop("proportion", None)
            self.put("dataset", sources[0], "datasets")
            return
        with_share = [source for source in sources if "proportion" in source]
        if len(with_share) != len(sources):
            self.error("dataset.mixture", "datasets: give every entry a `fraction`; without them trl concatenates whole datasets, "
                                          "and adapterd's mixture draws from each source by its proportion")
            return
        self.put("dataset", {"mixture": sources}, "datasets")

    def rewards(self) -> None:
        """GRPO's and RLOO's reward arguments: the functions adapterd ships by name, a reward model by
        id, and trl's reward_weights (model first, then the functions, as trl's script orders them)."""
        weights = self.get("reward_weights")
        weights = list(weights) if isinstance(weights, list) else None
        slots: list[dict[str, Any] | None] = []
        rewards: dict[str, Any] = {}
        if self.get("reward_model_name_or_path"):
            rewards["model"] = {"id": self.config["reward_model_name_or_path"]}
            slots.append(rewards["model"])
        names = self.get("reward_funcs") or []
        for index, name in enumerate([names] if isinstance(names, str) else names):
            if name in REWARD_FUNCTIONS:
                rewards.setdefault("functions", []).append({"name": REWARD_FUNCTIONS[name]})
                slots.append(rewards["functions"][-1])
            else:
                self.dropped.append(Dropped(f"reward_funcs.{index}", f"{name} is not a reward adapterd ships "
                                            "(exact_match, regex_match, length_penalty, think_format); a request never names code to import"))
                slots.append(None)
        if weights is not None:
            if len(weights) != len(slots):
                self.error("rewards", f"reward_weights: {len(weights)} weights for {len(slots)} rewards")
            for slot, weight in zip(slots, weights, strict=False):
                if slot is not None:
                    slot["weight"] = weight
        if rewards:
            self.request["rewards"] = rewards
            self.origin["rewards"] = "reward_funcs"

    def output(self) -> None:
        hub_model_id = self.get("hub_model_id")
        if self.output_repo is not None:
            self.put("output.repo_id", self.output_repo, "--output-repo")
            if hub_model_id is not None and hub_model_id != self.output_repo:
                self.dropped.append(Dropped("hub_model_id", "already said by output.repo_id (--output-repo)"))
        elif isinstance(hub_model_id, str) and "/" in hub_model_id:
            self.put("output.repo_id", hub_model_id, "hub_model_id")
        elif hub_model_id is not None:
            self.error("output.repo_id", f"hub_model_id {hub_model_id!r} has no namespace; give --output-repo NAMESPACE/NAME")
        else:
            self.error("output.repo_id", "the file has no hub_model_id; give --output-repo NAMESPACE/NAME")
        if self.get("hub_private_repo") is not None:
            self.put("output.private", self.config["hub_private_repo"], "hub_private_repo")
        if self.get("hub_revision") is not None:
            self.put("output.revision", self.config["hub_revision"], "hub_revision")
        if self.has("num_processes"):
            self.put("resources.gpus", self.get("num_processes"), "num_processes")
        self.drop("accelerate_config", _refused("training", "local_rank", "accelerate_config"))  # the daemon launches the processes

    def blocks(self) -> None:
        """TrainingArguments keys to `training`, the method's own config keys to its block."""
        training_defaults = self.section.get("training_defaults", {})
        for key in list(self.config):
            if key in self.taken:
                continue
            if key in self.training_fields:
                self.block_field("training", key, training_defaults.get(key, self.training_fields[key]["default"]))
            elif key in self.method_fields:
                self.block_field(self.method, key, self.method_fields[key]["default"])

    def block_field(self, block: str, key: str, default: Any) -> None:
        value = self.get(key)
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
            self.drop(key, _refused(block, key), default)
        elif not _same(value, default):
            self.put(f"{block}.{key}", value, key)

    def report_to(self, value: Any) -> None:
        allowed = _literals(TrainingSpec.model_fields["report_to"].annotation)
        names = [value] if isinstance(value, str) else list(value or [])
        names = [name for name in names if name != "none"]
        carried = [name for name in names if name in allowed]
        for name in names:
            if name == "all":
                self.dropped.append(Dropped("report_to", f"all: every integration installed on the host; a request names them ({', '.join(allowed)})"))
            elif name not in allowed:
                self.dropped.append(Dropped("report_to", f"{name}: not an integration a request may turn on ({', '.join(allowed)})"))
        if carried:
            self.put("training.report_to", carried, "report_to")

    def unknown(self, key: str) -> None:
        version = f"{self.section['package']} {self.section['version']}"
        self.dropped.append(Dropped(key, f"unknown to {version}'s {self.config_class}, ModelConfig and script arguments "
                                         "(trl's CLI passes such keys to `accelerate launch`)"))

    # --- the check ---

    def checked(self) -> Conversion:
        """The request through the daemon's own decoder; the converter's errors first, then the
        schema's on fields those do not already name."""
        conversion = Conversion(dropped=self.dropped, errors=list(self.errors))
        decoded = decode_request(json.dumps(self.request).encode(), scanner=SCANNER)
        if isinstance(decoded, Rejection):
            named = [error.path for error in self.errors]
            conversion.errors += [
                FieldError(path=error.path, message=self.annotated(error)) for error in decoded.errors
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
        needs = {"model": "model_name_or_path", "dataset": "dataset_name or datasets", "output": "hub_model_id NAMESPACE/NAME or --output-repo",
                 "rewards": "reward_funcs or reward_model_name_or_path", "reward_model": "reward_model_path"}
        top = error.path.split(".")[0]
        return f"{error.message} (set {needs[top]})" if top in needs else error.message


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _source(name: Any, data_files: Any = None) -> dict[str, Any] | str:
    """One dataset source from trl's dataset name or mixture entry `path`: a Hub id, a URL or an
    absolute path; a file builder (json, csv, parquet, arrow) with its data_files. A string: why not."""
    if not isinstance(name, str):
        return f"{name!r} is not a dataset name"
    if name in FILE_BUILDERS:
        if data_files is None:
            return f"the {name} builder reads data_files, and this entry has none"
        source: dict[str, Any] = {"format": FILE_BUILDERS[name]}
        if isinstance(data_files, str):
            source["url"] = data_files
        elif isinstance(data_files, list):
            source["files"] = {"train": data_files}
        else:
            source["files"] = data_files
        return source
    if name in OTHER_BUILDERS:
        return f"the {name} builder: adapterd reads json, jsonl, parquet, csv and arrow files"
    if name.startswith("/") or URL.match(name):
        return {"url": name}
    source = {"id": name}
    if data_files is not None:
        source["data_files"] = data_files
    return source
