"""The keys open-r1's recipes carry beyond TRL's: the fields its own config classes add to `trl.GRPOConfig` and
`trl.SFTConfig` (src/open_r1/configs.py at huggingface/open-r1 1416fa0cf21595d2083b399a2a0bbddd7f6e9563). Each is
carried where a request says it (the Hub branch to push to) or left out naming what open-r1 does with it and what
adapterd does instead, so that an open-r1 recipe converts with every key accounted for, none "unknown to trl".

Its reward keys (GRPOScriptArguments) are open_r1_rewards.py's; `system_prompt`, `chat_template` and
`dataset_prompt_column` are the dataset's and the model's (trl_datasets.py, trl_model.py).
"""

from __future__ import annotations

from daemon.cli.convert.ledger import Dropped, Ledger

# open-r1's fields that no request field holds, and why each is left out (configs.py's help, then adapterd's way).
_PUSHES_ONCE = (
    "adapterd pushes the result once, to output.revision, and keeps checkpoints in the host's checkpoint store"
)
_WANDB = "a job's Weights & Biases account and project are the host's environment (WANDB_*), with report_to wandb"
OPEN_R1_LEFT_OUT: dict[str, str] = {
    "benchmarks": (
        "open-r1 runs these LightEval benchmarks on its cluster after each push; a request's evaluation block judges "
        "the adapter before it is published instead (docs/requests.md, Evaluation)"
    ),
    "callbacks": f"open-r1's callbacks (push_to_hub_revision: each checkpoint pushed to a branch); {_PUSHES_ONCE}",
    "push_to_hub_revision": f"open-r1 pushes each checkpoint to a branch of its own; {_PUSHES_ONCE}",
    "overwrite_hub_revision": f"open-r1's checkpoint branches overwritten; {_PUSHES_ONCE}",
    "num_completions_to_print": "open-r1 prints completions to its log; TRL's log_completions logs them",
    "wandb_entity": f"open-r1 sets WANDB_ENTITY from it; {_WANDB}",
    "wandb_project": f"open-r1 sets WANDB_PROJECT from it; {_WANDB}",
    "wandb_run_group": f"open-r1 sets WANDB_RUN_GROUP from it; {_WANDB}",
}
REVISION_KEY = "hub_model_revision"  # open-r1's "Hub model branch to push the model to"; its default is "main"


def carry_open_r1(keys: Ledger) -> None:
    """open-r1's own config keys: `hub_model_revision` carried to output.revision (unless TRL's own `hub_revision`
    says it, which wins as TRL's would where both are set to one value; two values are an error naming both), the
    rest left out with why. Called before the output is carried."""
    for key, why in OPEN_R1_LEFT_OUT.items():
        if keys.has(key):
            keys.get(key)
            keys.dropped.append(Dropped(key, why))
    if not keys.has(REVISION_KEY):
        return
    revision = keys.get(REVISION_KEY)
    trl_revision = keys.config.get("hub_revision")
    if trl_revision is None:
        keys.put("output.revision", revision, REVISION_KEY)
    elif trl_revision == revision:
        keys.dropped.append(Dropped(REVISION_KEY, "already said by hub_revision"))
    else:
        keys.error(
            "output.revision",
            f"hub_model_revision {revision!r} (open-r1's branch to push to) and hub_revision {trl_revision!r} differ; "
            "keep one",
        )
