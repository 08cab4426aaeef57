"""The parts of a training request every method shares: the base model, the dataset, LoRA, the
common trainer arguments, the output, and `RequestBase`, which each method's request extends
(schemas/method_requests.py).

The `training` and `peft` blocks, and the model's loading options, are generated from the locked
transformers, PEFT and TRL (schemas/trl_fields.py): every field by its own name, less the ones a
request may not set (schemas/contract_rules.py). A field left out means "TRL's default": the daemon
passes on only what was set.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, field_validator, model_validator

from .chains import START_FROM_DESCRIPTION, AfterIds, chain_problem
from .common import (
    GPU_KIND_PATTERN,
    MODEL_ID_PATTERN,
    REQUEST_ID_PATTERN,
    SCHEMA_VERSION,
    Frozen,
    HubRevision,
    branch_problem,
)

# The dataset specs live in schemas/dataset.py; imported here too, where they always were.
from .dataset import MAX_INLINE_ROWS, DatasetSpec, MixtureComponent, SourceSpec  # noqa: F401
from .evaluation import EVAL_SET_SUITES, EvaluationSpec, MethodSuite
from .images import image_column
from .methods import METHODS
from .regex import library_pattern_problem
from .trl_block import TRLBlock
from .trl_fields import (
    LoraConfigFields,
    ModelConfigFields,
    TrainingArgumentsFields,
)

REPO_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
# A priority class or a team: part of a topic's name for a class, so Kafka's own topic characters, bounded.
QUEUE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MAX_GPU_KINDS = 16  # the kinds one request may accept
DEFAULT_TEAM = "default"


class ModelSpec(ModelConfigFields):
    """The base model to train: which one (`id`, `revision`), how to load it, and its chat template.
    The loading options besides these are `trl.ModelConfig`'s own (generated: schemas/trl_fields.py)."""

    id: str = Field(pattern=MODEL_ID_PATTERN, description="Hub repo id, or an absolute local path the operator allows.")
    revision: HubRevision = Field(
        None, description="Branch, tag or commit sha on the Hub; the default branch when absent."
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    trust_remote_code: bool = Field(False, description="Refused unless the operator's policy allows it.")
    quantization: Literal["none", "4bit", "8bit"] = Field(
        "none", description="4bit/8bit load the base through bitsandbytes (QLoRA); needs CUDA."
    )
    bnb_4bit_compute_dtype: Literal["float32", "float16", "bfloat16"] | None = Field(
        None,
        description="The compute dtype of a 4bit base (bitsandbytes); the model's dtype when unset.",
    )
    chat_template: str | None = Field(
        None,
        max_length=65536,
        description="A Jinja chat template, inline, that replaces the tokenizer's own for this job and is pushed with "
        "the result (TRL's chat_template_path, without reading a host path).",
    )


# The most patterns one `peft` field holds (each compiled twice at intake, about 0.2 ms).
MAX_PATTERNS = 64
# What PEFT's `layers_pattern` names: the model's list of layers (`layers`, `h`, `model.layers`).
_LAYERS_NAME = re.compile(r"[A-Za-z0-9_]{1,200}(?:\.[A-Za-z0-9_]{1,200}){0,15}")


class LoraSpec(LoraConfigFields):
    """PEFT LoRA settings, every `peft.LoraConfig` field by its own name (generated: schemas/trl_fields.py).
    `peft: null` in a request means a full fine-tune."""

    @model_validator(mode="after")
    def _patterns_run(self) -> LoraSpec:
        r"""PEFT reads these as regular expressions (a string `target_modules` or `exclude_modules` with
        `re.fullmatch`, each key of `rank_pattern` and `alpha_pattern` with `re.match`): each must
        compile with RE2 and with Python's re, judged here at intake, and the child matches them itself
        with RE2 before PEFT sees them (handlers/toolkit/lora_patterns.py); at most MAX_PATTERNS in a field, so
        that compiling them stays a bounded cost of intake. `layers_pattern` is pasted into a pattern
        PEFT runs with Python's re (`(?:^|.*?\.){name}\.(\d+)\.`) on every module name: it must be
        what PEFT's documentation says it is, the name of the model's list of layers (`layers`, `h`,
        `model.layers`), so that nothing in it can make that match backtrack."""
        layers = [self.layers_pattern] if isinstance(self.layers_pattern, str) else self.layers_pattern or []
        if len(layers) > MAX_PATTERNS:
            raise ValueError(f"layers_pattern: {len(layers)} names; at most {MAX_PATTERNS}")
        for layer in layers:
            if not _LAYERS_NAME.fullmatch(layer):
                raise ValueError(
                    f"layers_pattern: {layer[:64]!r} is not the name of a list of layers (letters, digits and '_', "
                    "parts joined by '.', at most 200 characters, e.g. 'layers' or 'model.layers'); a regular "
                    "expression is not accepted here"
                )
        # a list is of module names, which PEFT compares as text
        for name, value in (("target_modules", self.target_modules), ("exclude_modules", self.exclude_modules)):
            if isinstance(value, str) and not (name == "target_modules" and value == "all-linear"):  # PEFT's keyword
                problem = library_pattern_problem(value)
                if problem:
                    raise ValueError(f"{name}: {problem}")
        for name, patterns in (("rank_pattern", self.rank_pattern or {}), ("alpha_pattern", self.alpha_pattern or {})):
            if len(patterns) > MAX_PATTERNS:
                raise ValueError(f"{name}: {len(patterns)} keys; at most {MAX_PATTERNS}")
            for key in patterns:
                problem = library_pattern_problem(key)
                if problem:
                    raise ValueError(f"{name}: the key {key[:64]!r}: {problem}")
        return self


class TrainingSpec(TrainingArgumentsFields):
    """The trainer arguments common to every method, every `transformers.TrainingArguments` field a
    request may set, by its own name (generated: schemas/trl_fields.py)."""

    @model_validator(mode="after")
    def _patterns_run(self) -> TrainingSpec:
        """transformers matches `optim_target_modules` with `re.fullmatch` (a string, and each item of a
        list that is not a module name), for the GaLore and APOLLO optimizers only, after it has
        found their packages installed: the lock has neither, so on a host installed from it no
        request makes transformers run these. Held to the same rule as PEFT's patterns all the same
        (at most MAX_PATTERNS, each one RE2 and Python's re compile) for a host that adds them."""
        value = self.optim_target_modules
        patterns = [value] if isinstance(value, str) else value or []
        if len(patterns) > MAX_PATTERNS:
            raise ValueError(f"optim_target_modules: {len(patterns)} patterns; at most {MAX_PATTERNS}")
        for pattern in patterns:
            problem = library_pattern_problem(pattern)
            if problem:
                raise ValueError(f"optim_target_modules: {problem}")
        return self


class OutputSpec(Frozen):
    """Where the trained adapter goes."""

    repo_id: str = Field(pattern=REPO_ID_PATTERN, description="Hub model repo 'namespace/name'; created if missing.")
    private: bool = Field(True, description="Visibility of a repo adapterd creates; an existing repo keeps its own.")
    revision: str = Field(
        "main",
        max_length=255,
        description="Branch to commit to (git's rules for a branch name); created from the default branch if missing.",
    )
    push: Literal["adapter", "merged"] = Field(
        "adapter", description="'merged' merges the adapter into the base before pushing."
    )

    @field_validator("revision")
    @classmethod
    def _branch(cls, value: str) -> str:
        problem = branch_problem(value)
        if problem:
            raise ValueError(f"not a branch name: {problem}")
        return value


# The methods whose requests may ask for `resources.shard: fsdp`, each checked by a two-rank test
# (docs/methods.md says why only these).
SHARDED_METHODS = frozenset({"sft", "dpo", "reward", "kto", "grpo"})


class Resources(Frozen):
    gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="GPUs for the job; more than one runs data-parallel (torchrun) on one host, "
        "unless `shard` says otherwise.",
    )
    hosts: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "The hosts the job's GPUs span: more than one runs it on the operator's Ray cluster, its gpus split "
            "evenly across that many nodes (gpus a multiple of hosts). A job of more GPUs than a host has goes "
            "there whatever this says (deploy/README.md, Jobs bigger than one host)."
        ),
    )
    shard: Literal["auto", "none", "fsdp"] = Field(
        "auto",
        description=(
            "How the job's GPUs share the model: 'none' gives each GPU a whole copy (data-parallel); 'fsdp' shards "
            "the parameters, gradients and optimizer state across them (FSDP2 full-shard), so each holds about "
            "1/gpus of them; 'auto' (the default) is 'none' unless the job's memory estimate says a whole copy "
            "does not fit one of the host's GPUs and a shard across its gpus does, where sharding is offered for "
            "it: the `accepted` event names the plan. 'fsdp' needs gpus 2 or more; the methods and options it is "
            "offered with are in docs/methods.md."
        ),
    )

    gpu_kind: str | list[str] | None = Field(
        None,
        description=(
            "The kind of GPU the job needs ('h100-80gb'), or a list of the kinds it accepts; absent: any. The fleet's "
            "kinds are the operator's (gpu_kinds, deploy/README.md); one no kind of the fleet matches is rejected."
        ),
    )
    min_gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        le=4096,
        description=(
            "The least memory each of the job's GPUs must have, in GiB (a kind's nominal size: 'h100-80gb' has 80); "
            "absent: any."
        ),
    )

    @field_validator("gpu_kind")
    @classmethod
    def _kind_names(cls, value: str | list[str] | None) -> str | list[str] | None:
        """Checked here rather than by the type's constraints, so that a bad name is said once, by its field."""
        names = [value] if isinstance(value, str) else value or []
        if isinstance(value, list) and not 1 <= len(value) <= MAX_GPU_KINDS:
            raise ValueError(f"a list of 1 to {MAX_GPU_KINDS} kinds, got {len(value)}")
        for name in names:
            if not re.fullmatch(GPU_KIND_PATTERN, name):
                raise ValueError(
                    f"{name[:40]!r} is not a GPU kind's name (lower-case letters, digits, '.', '_' and '-', "
                    "at most 32, e.g. 'h100-80gb')"
                )
        return value

    @property
    def gpu_kinds(self) -> tuple[str, ...] | None:
        """The kinds it accepts (None: any)."""
        if self.gpu_kind is None:
            return None
        return (self.gpu_kind,) if isinstance(self.gpu_kind, str) else tuple(self.gpu_kind)

    @model_validator(mode="after")
    def _shards_across_gpus(self) -> Resources:
        if self.shard == "fsdp" and self.gpus < 2:
            # A check on the block names its field inside it (schemas/decode.py): the path is resources.shard.
            raise ValueError(
                f"shard: '{self.shard}' shards the model across the job's GPUs, and resources.gpus is "
                f"{self.gpus}: set gpus to 2 or more"
            )
        if self.gpus % self.hosts:
            raise ValueError(
                f"hosts: {self.hosts} hosts share the job's GPUs evenly, and resources.gpus is {self.gpus}: "
                "set gpus to a multiple of hosts"
            )
        return self


def _mark_experimental(schema: dict[str, Any], model: type[Any]) -> None:
    """Mark an experimental method's request in the JSON Schema (`x-adapterd-experimental`), from the method table."""
    method = get_args(model.model_fields["method"].annotation)[0] if "method" in model.model_fields else None
    if method in METHODS and METHODS[method].status == "experimental":
        schema["x-adapterd-experimental"] = True


class RequestBase(Frozen):
    """The fields every method shares."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_mark_experimental)
    if TYPE_CHECKING:  # each method's model declares it as its Literal name (schemas/method_requests.py)
        method: str

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str = Field(pattern=REQUEST_ID_PATTERN, description="Idempotency key; also the Kafka key.")
    model: ModelSpec
    dataset: DatasetSpec
    # A block left out is one shared instance (they are frozen): a fresh one per request ran the
    # block's validator over all its fields, a quarter of the time decoding a request took.
    peft: LoraSpec | None = Field(LoraSpec(), description="LoRA settings; null for a full fine-tune.")
    training: TrainingSpec = TrainingSpec()
    output: OutputSpec
    resources: Resources = Resources()
    evaluation: EvaluationSpec | None = Field(
        None,
        description=(
            "Evaluate the adapter on held-out rows after training, beside baselines, and publish it to output.revision "
            "only when it passes the gate (schemas/evaluation.py); absent: no evaluation, published as trained."
        ),
    )
    timeout_s: int | None = Field(
        None, ge=1, description="Wall-clock limit of the job; capped by the operator's maximum."
    )
    priority_class: str | None = Field(
        None,
        pattern=QUEUE_NAME_PATTERN,
        description=(
            "One of the operator's priority classes (deploy/README.md): a higher class starts first and may preempt a "
            "preemptible lower one; absent: the operator's default class. A class the fleet does not have is rejected."
        ),
    )
    team: str | None = Field(
        None,
        pattern=QUEUE_NAME_PATTERN,
        description=(
            "Whose request it is, for the fleet's fair share between teams (weights and caps are the "
            "operator's); absent: 'default'."
        ),
    )
    after: AfterIds = Field(default_factory=list)  # a pipeline's earlier steps (schemas/chains.py)
    start_from: str | None = Field(None, pattern=REQUEST_ID_PATTERN, description=START_FROM_DESCRIPTION)
    # Bounded so that an event, which echoes it, stays far below the broker's message size.
    metadata: dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Free key-value pairs (64 at most, keys up to 128 characters, values up "
        "to 1024), echoed in every event.",
    )

    @model_validator(mode="after")
    def _inline_rows_fit_the_method(self) -> RequestBase:
        chain = chain_problem(self.request_id, self.method, self.after, self.start_from)
        if chain:
            raise ValueError(chain)
        if self.dataset.rows is not None:
            common = set.intersection(*(set(row) for row in self.dataset.rows))
            every = set.union(
                *(set(row) for row in self.dataset.rows)
            )  # an image column only some rows have counts too
            problem = self.dataset_problem([self.dataset.columns.get(c, c) for c in common])
            if not problem and every != common:  # dataset_problem has looked for images among the common columns
                problem = self.text_only_problem([self.dataset.columns.get(c, c) for c in every])
            if problem:
                raise ValueError(problem)
        if self.dataset.streaming and self.training.max_steps is None:
            raise ValueError("training.max_steps: a streaming dataset has no length; set max_steps")
        if self.model.quantization != "none" and self.peft is None:
            raise ValueError(f"model.quantization {self.model.quantization} (QLoRA) trains a LoRA adapter: set 'peft'")
        if self.evaluation is not None:
            problem = self.evaluation_problem(self.evaluation)
            if problem:
                raise ValueError(problem)
        if self.resources.shard == "fsdp":  # 'auto' shards only where this allows it (daemon/resources/shards.py)
            problem = self.sharding_problem()
            if problem:
                raise ValueError(problem)
        return self

    def sharding_problem(self) -> str | None:
        """Why this request cannot train sharded (`resources.shard: fsdp`, asked or chosen for 'auto'), or None: what
        shards is what the sharded tests check (docs/methods.md's table of method × adapter kind), and the rest is
        refused, naming why, rather than run unsharded."""
        shard = "resources.shard: 'fsdp'"
        if self.method not in SHARDED_METHODS:
            return (
                f"{shard} is offered for {', '.join(sorted(SHARDED_METHODS))}, not for method {self.method}: its "
                "trainer is not wired or tested sharded (docs/methods.md)"
            )
        if self.start_from is not None:  # its adapter is loaded on a whole model (handlers/toolkit/start_from.py)
            return f"{shard}: start_from {self.start_from} trains on a whole copy of the model; use shard 'none'"
        if self.method == "reward" and self.peft is not None:
            return (
                f"{shard} trains a reward model as a full fine-tune only: with LoRA, PEFT trains a copy of the score "
                "head beside the sharded one (modules_to_save), which FSDP2 never gathers; set peft null"
            )
        if getattr(self.method_config, "use_vllm", None):  # only the online methods' TRL configs have use_vllm
            return (
                f"{shard} generates with the sharded policy's own generate: vLLM is not offered sharded (it would need "
                "the full weights gathered into its engine on every rank at each step); set use_vllm false"
            )
        copies = (
            []
            if self.peft is None
            else [
                name
                for name, value in (
                    ("modules_to_save", self.peft.modules_to_save),
                    ("trainable_token_indices", self.peft.trainable_token_indices),
                )
                if value is not None
            ]
        )
        if copies:
            return (
                f"{shard}: peft.{copies[0]} trains a whole copy of sharded modules beside them, which "
                "FSDP2 never gathers; leave it out"
            )
        if self.model.quantization != "none":
            # Tried on two CPU ranks (bitsandbytes 0.50.2, 4-bit with a float storage dtype as in the FSDP+QLoRA
            # recipe): the base loads sharded, and its first forward fails (bitsandbytes repacks a 4-bit weight for its
            # CPU kernel into a shape other than the shard FSDP2 registered). A route the CPU tests cannot run is not
            # offered (docs/methods.md).
            return (
                f"{shard} does not shard a quantized base (model.quantization {self.model.quantization}): FSDP2's "
                "shards of bitsandbytes' packed weights fail on the CPU ranks adapterd is tested on, so QLoRA is not "
                "offered sharded; use quantization 'none' (LoRA on a sharded bf16 base) or a whole copy (shard 'none')"
            )
        others = (
            [suite.kind for suite in self.evaluation.suites if not isinstance(suite, MethodSuite)]
            if self.evaluation is not None
            else []
        )
        if others:
            return (
                f"{shard} evaluates with the method's own measure only (the trainer's evaluate, on every rank): a "
                f"'{others[0]}' suite generates and scores on each rank apart, not checked sharded; leave it out"
            )
        return None

    def evaluation_problem(self, evaluation: EvaluationSpec) -> str | None:
        """Why this request cannot be evaluated as its `evaluation` block asks, or None."""
        if not METHODS[self.method].evaluates:
            return f"evaluation: method {self.method} has no evaluation in adapterd"
        reads_eval_set = [i for i, suite in enumerate(evaluation.suites) if isinstance(suite, EVAL_SET_SUITES)]
        if (
            reads_eval_set
            and self.dataset.eval is None
            and self.dataset.eval_split is None
            and self.dataset.test_split_size is None
        ):
            return (
                f"evaluation.suites.{reads_eval_set[0]}: a '{evaluation.suites[reads_eval_set[0]].kind}' suite "
                "runs on the eval set: set dataset.eval, dataset.eval_split or dataset.test_split_size (a "
                "'task' suite brings its own rows)"
            )
        if evaluation.on_fail == "pr" and self.output.revision != "main":
            return (
                "evaluation.on_fail: a pull request is opened against main, and output.revision is "
                f"'{self.output.revision}': use on_fail 'branch'"
            )
        if evaluation.fail_branch is not None and evaluation.fail_branch == self.output.revision:
            return "evaluation.fail_branch: must differ from output.revision, where an adapter that passes goes"
        for index, rule in enumerate(evaluation.gate):
            if rule.of is not None and rule.of not in evaluation.baselines:
                return (
                    f"evaluation.gate[{index}].of: '{rule.of}' is not among evaluation.baselines {evaluation.baselines}"
                )
        if evaluation.require_finite_losses and self.training.logging_nan_inf_filter:
            return (
                "training.logging_nan_inf_filter: true logs earlier losses in place of NaN ones, which "
                "evaluation.require_finite_losses looks for; leave it unset or set require_finite_losses false"
            )
        if "base" in evaluation.baselines and self.peft is None:
            return (
                "evaluation.baselines: 'base' is measured with the adapter disabled, and a full "
                "fine-tune (peft: null) has none"
            )
        return None

    @property
    def experimental(self) -> bool:
        """Whether the method runs on TRL's experimental layer (`trl.experimental...`), whose API may
        change between TRL releases: the method table says."""
        return METHODS[self.method].status == "experimental"

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        """The column sets the method accepts, any one of which the dataset must have (after `columns`)."""
        raise NotImplementedError(f"{type(self).__name__} must say which dataset columns it accepts")

    def text_only_problem(self, columns: list[str]) -> str | None:
        """Why a dataset with an image column among these cannot feed a text-only method, or None."""
        method = self.method
        images = image_column(columns)
        if images is not None and not METHODS[method].vision:
            vision = ", ".join(name for name, row in METHODS.items() if row.vision)
            return (
                f"dataset.columns: '{images}': method {method} trains on text only; the "
                f"vision-language methods are {vision}"
            )
        return None

    def dataset_problem(self, columns: list[str]) -> str | None:
        """Why a dataset with these columns cannot feed this method, or None when it can."""
        problem = self.text_only_problem(columns)
        if problem:
            return problem
        formats = self.accepted_formats()
        if any(form <= set(columns) for form in formats):
            return None
        options = " or ".join(" and ".join(f"'{c}'" for c in sorted(form)) for form in formats)
        return f"dataset.columns: method {self.method} needs {options}; found {sorted(columns)}"

    @property
    def method_config(self) -> TRLBlock:
        """The block of the method's own TRL config fields (`sft`, `dpo`, ...)."""
        block: TRLBlock = getattr(self, self.method)  # each request class names its block after its method
        return block

    def set_fields(self, block: str) -> dict[str, Any]:
        """The fields of one block that the request set, to pass on to TRL as keyword arguments."""
        named: TRLBlock = getattr(self, block)  # a block by its name in the request: `training` or the method's
        return named.set_fields()
