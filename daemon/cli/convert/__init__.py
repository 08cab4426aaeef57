"""`adapterd convert`: recipes of other tools turned into requests, every key accounted for. The
command is here; the work is in this package's modules, which run offline, for the CLI only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

convert_app = typer.Typer(no_args_is_help=True, help="Turn another tool's config into an adapterd request.")


CONVERT_TRL_HELP = (
    "Print the adapterd request a `trl` CLI config file makes (the YAML of `trl sft --config "
    "FILE`), as JSON on stdout.\n\n"
    "Each key goes where a request says it: TrainingArguments keys to `training`, the method's config keys to its "
    "block (`sft`, `dpo`, ...), trl.ModelConfig's to `model` and `peft` (use_peft and lora_*; without use_peft, "
    "`peft: null`, a full fine-tune, as trl does), dataset_name and its options or a `datasets:` mixture to "
    "`dataset`, hub_model_id to `output.repo_id`, num_processes to `resources.gpus`. Where adapterd's default differs "
    "from the trl CLI's, the request states trl's: model.dtype float32 unless the file sets dtype, "
    "peft.target_modules null (PEFT's choice for the architecture) unless it sets lora_target_modules, no nested "
    "quantization with load_in_4bit.\n\n"
    "A key TRL or transformers renamed since the recipe was written (torch_dtype, evaluation_strategy, max_seq_length, "
    "...) is carried under its new name and said on stderr with the release that renamed it; a removed key is named "
    "with what replaced it (daemon/cli/convert/trl_renames.py).\n\n"
    "Each key the request cannot carry is named on stderr, one line each, with why: refused (the reason from the "
    "refusal table), set by the daemon, unused, unknown to trl, or already said by another field. A key that is a "
    "typo of one trl knows (learning_rat) is an error naming that one. A key whose value is TRL's default is left "
    "out, said so: the job gets that default too. Every key of the file has its line on stderr, in the file's order: "
    "carried (to which request field), carried under a new name, carried with a change of meaning, left at TRL's "
    "default, or left out with why.\n\n"
    "The request is checked as the daemon checks it, and with --config as that host's daemon would judge it (its "
    "policy: report_to, models, datasets; its bounds). Exit 0 when it converted (keys left out or not), 1 when the "
    "request is not valid or the host refuses it (each field named, with the key it came from), 2 on a usage error."
)


@convert_app.command("trl-config", help=CONVERT_TRL_HELP)
def convert_trl_config(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, help="The YAML file a `trl` CLI run takes (`trl sft --config FILE`)."
        ),
    ],
    method: Annotated[
        str | None, typer.Option(help="The training method; by default the one the file's name starts with (sft.yaml).")
    ] = None,
    output_repo: Annotated[
        str | None, typer.Option(help="output.repo_id, NAMESPACE/NAME; by default the file's hub_model_id.")
    ] = None,
    request_id: Annotated[
        str | None, typer.Option(help="The request id; by default the file's name and the time (a new run).")
    ] = None,
    host_config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Also judge the request by this host's settings (policy, bounds), as its daemon would.",
        ),
    ] = None,
) -> None:
    """Print the adapterd request a `trl` CLI config file makes (daemon/cli/convert/trl_config.py does the work)."""
    from datetime import UTC, datetime

    from daemon.cli.convert.ledger import UsageError
    from daemon.cli.convert.trl_config import convert
    from daemon.cli.convert.trl_file import default_request_id, method_for, read_trl_config

    try:
        config = read_trl_config(file)
        keys = list(config)  # the file's own: a renamed key is carried under its new name in `config`
        chosen = method_for(file, method)
        conversion = convert(
            config,
            chosen,
            request_id or default_request_id(file, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")),
            output_repo,
        )
    except UsageError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc
    for line in conversion.lines(keys):
        typer.echo(line, err=True)
    if conversion.request is None:
        typer.echo(f"{file}: the {chosen} request it makes is not valid:", err=True)
        for error in conversion.errors:
            typer.echo(f"  {error.path or '(request)'}: {error.message}", err=True)
        raise typer.Exit(1)
    if host_config is not None:
        from daemon.cli.checks.host import host_check

        plan = host_check(conversion.request, host_config, f"{file}'s request")
        if plan:
            typer.echo(f"{host_config} would run it {plan}", err=True)
    document = conversion.request.model_dump(mode="json", exclude_unset=True)
    head = {name: document.pop(name) for name in ("schema_version", "request_id", "method")}
    typer.echo(json.dumps(head | document, indent=2))
