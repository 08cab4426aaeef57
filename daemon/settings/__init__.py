"""The daemon's settings: a TOML file, overridden by `ADAPTERD_*` environment variables (how it reaches
Kafka: daemon/settings/kafka.py; how it runs jobs: daemon/settings/work.py; its endpoint:
daemon/settings/endpoints.py; mixins of `Settings`).

Validated once at start; a wrong value stops the daemon with the setting's name and what was wrong.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from daemon.errors import ConfigError
from daemon.settings.endpoints import EndpointSettings
from daemon.settings.fleet import CLASS_HEADER, PriorityClass, TeamShare, queue_topic
from daemon.settings.kafka import KafkaSettings
from daemon.settings.ray import RaySettings
from daemon.settings.secret_files import HfTokenSource, SecretFilesSource, event_keys, event_signer, team_keys
from daemon.settings.work import WorkSettings
from schemas.images import ImageBounds
from schemas.typos import meant_field

DEFAULT_HUB_ENDPOINT = "https://huggingface.co"


# lm-eval tasks checked to run on a request's rows with nothing fetched: multiple-choice tasks scored
# by log-likelihood, and GSM8K's generation scored by its own regex filters.
VETTED_EVALUATION_TASKS = (
    "arc_easy",
    "arc_challenge",
    "boolq",
    "hellaswag",
    "openbookqa",
    "piqa",
    "sciq",
    "winogrande",
    "gsm8k",
)


class Settings(BaseSettings, EndpointSettings, WorkSettings, KafkaSettings):
    model_config = SettingsConfigDict(env_prefix="ADAPTERD_", extra="forbid", frozen=True)
    # Kafka (daemon/settings/kafka.py), then Work (daemon/settings/work.py), then the endpoint
    # (daemon/settings/endpoints.py): the mixins' fields come first, as they always have

    # Policy: what requests may ask of this host. A request outside it is rejected with the rule it broke.
    # The fleet's queue (daemon/settings/fleet.py; deploy/README.md): none by default.
    priority_classes: list[PriorityClass] = Field(
        default_factory=list,
        description=(
            "The fleet's priority classes, highest first; empty: each requests partition is "
            "its own first-in-first-out queue."
        ),
    )
    default_priority_class: str | None = Field(
        None, description="The class of a request that names none; unset: the last (lowest) class."
    )
    teams: dict[str, TeamShare] = Field(
        default_factory=dict,
        description=(
            "Each team's weight and cap of slots, and who may write as it (producer_keys) in which classes; a team not "
            "listed has weight 1 and no cap, and once any team has producer keys, a team not listed is refused."
        ),
    )
    # What the minimum costs: on a full fleet of young preemptible jobs, an urgent request is read at once but waits
    # this long at most before a job is stopped for it (then the stop's checkpoint, within drain_timeout_s). 600 s made
    # that ten minutes; 120 s still lets a job load its model and reach training, so a stop saves a checkpoint it
    # resumes from.
    preempt_min_run_s: float = Field(
        120.0,
        ge=0,
        description=(
            "A job runs at least this long before a higher class may preempt it: the longest a higher class's "
            "request waits on a full fleet for a job to be stopped for it (it is read at once), before the stop's "
            "checkpoint (within drain_timeout_s)."
        ),
    )
    preempt_max_count: int = Field(2, ge=0, description="A request preempted this many times is not preempted again.")
    queue_wait_event_s: float = Field(
        5.0, ge=0, description="A request read and still waiting after this long gets a `queued` event."
    )
    # A request of several GPUs would otherwise wait for ever behind one-GPU requests that take each slot as it frees
    # (daemon/jobs/reservation.py). A minute lets the slots that free meanwhile go to waiting one-GPU jobs (no GPU left
    # idle for a short wait) and then bounds it: after it the host drains, and the request starts when its running
    # jobs end, a job of known end before then backfilling the slots that would idle.
    reserve_after_s: float = Field(
        60.0,
        ge=0,
        description=(
            "A request of several GPUs that has waited this long for enough free slots at once has the "
            "host reserved for it: no job starts there unless it is expected to end before the reservation "
            "is due (backfill); 0: at once."
        ),
    )

    allowed_local_model_roots: list[Path] = Field(
        default_factory=list, description="Folders a request's model.id may name."
    )
    allowed_models: list[str] = Field(
        default_factory=list,
        description="Glob patterns of Hub base models (and reward and reference models); empty allows any.",
    )
    allowed_datasets: list[str] = Field(
        default_factory=list, description="Glob patterns of Hub dataset ids; empty allows any."
    )
    allowed_dataset_urls: list[str] = Field(
        default_factory=list,
        description="Glob patterns of object-storage URLs datasets may come from "
        "(s3://bucket/prefix/*); empty allows none.",
    )
    allowed_local_dataset_roots: list[Path] = Field(
        default_factory=list, description="Folders datasets may be read from; empty allows none."
    )
    dataset_storage_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "fsspec options per URL scheme, e.g. {s3 = {client_kwargs = {endpoint_url = ...}}}: endpoints and regions, "
            "not credentials (those come from the environment or credential files, e.g. AWS_SHARED_CREDENTIALS_FILE)."
        ),
    )
    allowed_evaluation_tasks: list[str] = Field(
        default_factory=lambda: list(VETTED_EVALUATION_TASKS),
        description=(
            "Glob patterns of lm-eval task names an evaluation's 'task' suite may run (each on the request's own "
            "rows); by default tasks whose prompts and metrics run offline on given rows; empty allows none."
        ),
    )
    local_model_hub_ids: dict[str, str] = Field(
        default_factory=dict, description="The Hub id a local base model came from, by path, for model cards."
    )
    allowed_output_namespaces: list[str] = Field(
        default_factory=list, description="Hub namespaces adapters may be pushed to; empty allows any."
    )
    allow_trust_remote_code: bool = False
    max_timeout_s: int | None = Field(
        7 * 86_400,
        ge=1,
        description="The longest timeout_s a request may ask for; also the timeout of those that ask none (a week).",
    )
    # The bounds on the work a request may ask for (daemon/admission/bounds.py says which field each bounds).
    max_batch_size: int = Field(
        256, ge=1, description="Per-device batch sizes (train, eval, reference precompute, generation)."
    )
    max_gradient_accumulation_steps: int = Field(1024, ge=1)
    max_processes: int = Field(
        8, ge=0, description="dataloader_num_workers and dataset_num_proc: processes a job may start."
    )
    max_steps: int = Field(1_000_000, ge=1, description="The most optimizer steps a request may ask for (max_steps).")
    max_epochs: float = Field(100, gt=0, description="num_train_epochs (and PPO's and GRPO's epochs and iterations).")
    max_generations: int = Field(
        64, ge=1, description="Completions per prompt (num_generations, num_return_sequences, num_beams)."
    )
    max_new_tokens: int = Field(
        32_768,
        ge=1,
        description="Tokens a completion may have (max_completion_length, generation_kwargs.max_new_tokens).",
    )
    max_sequence_length: int = Field(131_072, ge=1, description="max_length of a tokenized example.")
    max_dataset_rows: int | None = Field(
        None, ge=1, description="The most training rows a job may use (inline rows, max_samples, or the loaded split)."
    )
    max_gpus_per_job: int | None = Field(None, ge=1)
    max_model_bytes: int = Field(
        200_000_000_000,
        ge=1,
        description="A Hub model whose files add up to more fails before its download (download_too_large).",
    )
    max_template_bytes: int = Field(
        256 * 2**20, ge=2**20, description="Memory a request's chat template may take to render once in preflight."
    )
    max_template_s: float = Field(
        10.0, gt=0, description="Seconds a request's chat template may take to render once in preflight."
    )
    max_dataset_bytes: int = Field(
        100_000_000_000,
        ge=1,
        description="A dataset source whose files add up to more fails before it is read (a "
        "stream is not downloaded whole).",
    )
    # Images of vision-language jobs, inline (checked at intake) or in a dataset (checked by the child before training).
    max_images_per_row: int = Field(
        ImageBounds().max_images_per_row, ge=1, description="The most images one row may hold."
    )
    max_image_bytes: int = Field(
        ImageBounds().max_image_bytes, ge=1, description="The largest encoded image, in bytes."
    )
    max_image_pixels: int = Field(
        ImageBounds().max_image_pixels, ge=1, description="The most pixels (width × height) of a decoded image."
    )
    allowed_report_to: list[str] = Field(
        default_factory=list, description="TRL report_to integrations a request may switch on."
    )
    report_to: list[str] = Field(default_factory=list, description="TRL report_to integrations on for every job.")
    mlflow_tracking_uri: str | None = Field(
        None,
        description=(
            "The MLflow tracking server jobs with report_to 'mlflow' log to (the child's MLFLOW_TRACKING_URI); "
            "unset: such requests are rejected. Its credentials come from the unit's environment "
            "(MLFLOW_TRACKING_TOKEN, or _USERNAME and _PASSWORD)."
        ),
    )
    mlflow_experiment: str = Field(
        "adapterd", description="The MLflow experiment the runs go to (one run per job, named by its request id)."
    )
    tensorboard_dir: Path | None = Field(
        None,
        description=(
            "Where jobs with report_to 'tensorboard' write their event files, a folder per request id (serve it with "
            "`tensorboard --logdir`); unset: such requests are rejected."
        ),
    )
    trackio_dir: Path | None = Field(
        None,
        description=(
            "Where jobs with report_to 'trackio' log (the child's TRACKIO_DIR: a SQLite file per training.project; "
            "serve it with `trackio show`). Only this folder: a Space, a server or a bucket on the Hub is never used. "
            "Unset: such requests are rejected."
        ),
    )
    vllm_server_base_url: str | None = Field(
        None,
        description=(
            "The vLLM server (`trl vllm-serve`) that GRPO and RLOO requests with vllm_mode 'server' generate with; "
            "unset: such requests are rejected. A request never names a server itself."
        ),
    )

    # Hub
    hub_endpoint: str = DEFAULT_HUB_ENDPOINT
    hub_token: SecretStr | None = Field(
        None,
        description="Without one (nor hub_token_file, nor $HF_TOKEN), artifacts go to the "
        "local sink under work_dir/outputs.",
    )
    hub_token_file: Path | None = Field(
        None, description="A file holding the token (systemd: %d/hub-token from LoadCredential=)."
    )
    hub_push_attempts: int = Field(5, ge=1)
    hub_timeout_s: float = Field(
        120.0, gt=0, description="A Hub call without an answer for this long fails, and is retried."
    )

    # Jobs bigger than this host (daemon/settings/ray.py; deploy/README.md): none by default.
    ray: RaySettings | None = Field(
        None, description="The Ray cluster requests asking more GPUs than this host has run on; unset: rejected."
    )

    # Logs
    host: str = Field(default_factory=socket.gethostname)
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="after")
    def _event_keys(self) -> Settings:
        """Every key readable now, each problem named by its setting, rather than at the first event.
        Here rather than beside its fields (daemon/settings/endpoints.py): it reads them through
        secret_files, a layer beside that mixin."""
        event_signer(self)
        event_keys(self)
        return self

    @model_validator(mode="after")
    def _signed_store(self) -> Settings:
        """A checkpoint store is trusted only as far as what the fleet signed in it (daemon/store/documents.py):
        without the key a host could neither sign what it writes there nor tell the fleet's checkpoints from
        anyone's."""
        if self.checkpoint_store is not None and self.event_signing_key_file is None:
            raise ValueError(
                "checkpoint_store needs event_signing_key_file: the fleet's key signs each checkpoint's manifest and "
                "succeeded.json, and a host trusts nothing in the store it did not sign (`adapterd keys` makes one)"
            )
        return self

    @model_validator(mode="after")
    def _classes(self) -> Settings:
        names = [c.name for c in self.priority_classes]
        if len(set(names)) != len(names):
            raise ValueError(f"priority_classes: each name once, got {names}")
        if self.default_priority_class is not None and self.default_priority_class not in names:
            raise ValueError(
                f"default_priority_class {self.default_priority_class!r} is not one of priority_classes {names}"
            )
        return self

    @model_validator(mode="after")
    def _classes_trust(self) -> Settings:
        """With classes every host and the CLI's places decide from the events (daemon/fleet/view.py): without a key to
        verify them, one unsigned event steers them. Refused, not warned; a single host too (one `adapterd keys` pair is
        all it needs). The retry key is required where the daemon starts (daemon/fleet/wiring.py): a CLI never holds
        it."""
        if (
            self.priority_classes
            and self.event_signing_key_file is None
            and not self.event_verify_keys
            and self.event_verify_keys_file is None
        ):
            raise ValueError(
                "priority_classes need event_signing_key_file or event_verify_keys(_file): the fleet's decisions are "
                "folded from events, and only signed ones may count (`adapterd keys DIR` makes a pair)"
            )
        return self

    @model_validator(mode="after")
    def _teams(self) -> Settings:
        """Every team's producer keys readable and its classes known now (daemon/admission/grants.py), each
        problem named by its setting."""
        names = [c.name for c in self.priority_classes]
        owners: dict[str, str] = {}
        for name, team in self.teams.items():
            for key in team_keys(name, team).by_id:
                # A key listed for two teams would speak for both: the binding would be none.
                if owners.setdefault(key, name) != name:
                    raise ValueError(
                        f"teams.{name}.producer_keys: key {key} is team {owners[key]}'s too; "
                        "give each team a key of its own"
                    )
            unknown = [c for c in team.classes or () if c not in names]
            if unknown:
                known = f"one of {', '.join(names)}" if names else "none: this fleet has no priority_classes"
                raise ValueError(f"teams.{name}.classes: unknown class {unknown[0]!r}; expected {known}")
        return self

    @property
    def default_class(self) -> str | None:
        """The class of a request that names none (None on a host with no classes)."""
        if not self.priority_classes:
            return None
        return self.default_priority_class or self.priority_classes[-1].name

    def runs_as(self, headers: Iterable[tuple[str, bytes | None]] | None, named: str | None) -> str | None:
        """The class a request runs as: a claim's, as the dispatcher wrote it (`adapterd-class`, signed with the claim:
        daemon/kafka/queue_seal.py), else the one it names, else the default (None on a host with no classes)."""
        for name, value in headers or ():
            if name == CLASS_HEADER and value is not None and value.decode(errors="replace") in self.class_topics:
                return value.decode()
        return named or self.default_class

    @property
    def class_topics(self) -> dict[str, str]:
        """Each class's queue topic, highest class first (empty on a host with no classes)."""
        default = self.default_class
        return (
            {
                c.name: queue_topic(self.requests_topic, self.priority_classes, default, c.name)
                for c in self.priority_classes
            }
            if default
            else {}
        )

    @field_validator("vllm_server_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")

    @field_validator("allowed_local_model_roots", "allowed_local_dataset_roots")
    @classmethod
    def _absolute(cls, value: list[Path]) -> list[Path]:
        for root in value:
            if not root.is_absolute():
                raise ValueError(f"{root} is not an absolute path")
        return value

    @property
    def image_bounds(self) -> ImageBounds:
        return ImageBounds(
            max_images_per_row=self.max_images_per_row,
            max_image_bytes=self.max_image_bytes,
            max_image_pixels=self.max_image_pixels,
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _CONFIG_FILE.get() or os.environ.get("ADAPTERD_CONFIG")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        sources.append(SecretFilesSource(settings_cls))  # it reads the *_file values the others found
        sources.append(HfTokenSource(settings_cls))  # last: $HF_TOKEN only when no source above named a token
        return tuple(sources)


# The file load_settings was given, read by settings_customise_sources while that call builds its
# Settings. A context variable rather than os.environ, so loading one file leaves every later
# Settings(...) in the process as it was.
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("adapterd_config_file", default=None)


# Where the command line looks for its settings when neither --config nor ADAPTERD_CONFIG names a
# file: the current folder (a project's own), then the host's (deploy/README.md installs it there).
LOCAL_CONFIG = Path("adapterd.toml")
SYSTEM_CONFIG = Path("/etc/adapterd/adapterd.toml")


def find_config(config_file: Path | None = None) -> tuple[Path | None, str]:
    """The settings file to read and how it was found: `config_file` (--config), $ADAPTERD_CONFIG,
    ./adapterd.toml, /etc/adapterd/adapterd.toml, in that order; (None, ...) when there is none, and
    the built-in defaults apply. A file named by --config or ADAPTERD_CONFIG that is missing is a ConfigError."""
    if config_file is not None:
        if not config_file.is_file():
            raise ConfigError(f"config file {config_file} does not exist")
        return config_file, f"{config_file} (--config)"
    if path := os.environ.get("ADAPTERD_CONFIG"):
        if not Path(path).is_file():
            raise ConfigError(f"config file {path} (from ADAPTERD_CONFIG) does not exist")
        return Path(path), f"{path} (from ADAPTERD_CONFIG)"
    for candidate in (LOCAL_CONFIG, SYSTEM_CONFIG):
        if candidate.is_file():
            return candidate, f"{candidate.absolute()}"
    return (
        None,
        f"no settings file (no --config, ADAPTERD_CONFIG, ./{LOCAL_CONFIG} or {SYSTEM_CONFIG}): the built-in defaults",
    )


def load_settings(config_file: Path | None = None, **overrides: object) -> Settings:
    """Settings from the file find_config finds and the environment, or a ConfigError naming each bad setting."""
    config_file, _ = find_config(config_file)
    token = _CONFIG_FILE.set(config_file)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {_problem(e)}" for e in exc.errors())
        raise ConfigError(f"invalid settings: {problems}") from exc
    finally:
        _CONFIG_FILE.reset(token)


def _problem(error: ErrorDetails) -> str:
    """What is wrong with one setting; a key no setting has names the one it is most likely a typo of."""
    meant = meant_field(Settings, tuple(error["loc"])) if error["type"] == "extra_forbidden" else None
    return f"{error['msg']}; did you mean {meant!r}?" if meant else error["msg"]
