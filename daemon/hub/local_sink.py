"""Where the local sink writes, for hosts without a Hub token: work_dir/outputs/<namespace>/<name>
for main, <name>@<branch> beside it for another branch, <name>#<request id> for a failed gate's pull
request; never outside work_dir/outputs, whatever a request says."""

from __future__ import annotations

import os
from pathlib import Path

from daemon.errors import PushFailed
from daemon.settings import Settings
from schemas.request import RequestBase


def local_target(request: RequestBase, settings: Settings, branch: str | None = None) -> Path:
    """Where the local sink puts a request's artifact: work_dir/outputs/<namespace>/<name>, or
    <name>@<branch> for another branch (beside main's folder, not inside it: a push replaces its
    folder whole)."""
    output = request.output
    branch = branch if branch is not None else output.revision
    return _inside_outputs(output.repo_id if branch == "main" else f"{output.repo_id}@{branch}", settings)


def published_folder(repo_id: str, settings: Settings) -> Path:
    """Where the local sink published `repo_id` to its main revision on this host: what a pipeline's next step starts
    from (daemon/jobs/prerequisites.py). From the repo id alone, never from a folder an event names: an event is not a
    rule of the operator's, and the sink writes nowhere else."""
    return _inside_outputs(repo_id, settings)


def local_pull_request(request: RequestBase, settings: Settings) -> Path:
    """The local sink's pull request: the artifact proposed beside main's folder, never in it, as
    <name>#<request id>. One per request (a retry replaces it, as a Hub pull request is found again by
    its title); '#' is in no repo id and the name has no '@', so no branch's folder can be it."""
    return _inside_outputs(f"{request.output.repo_id}#{request.request_id}", settings)


def _inside_outputs(name: str, settings: Settings) -> Path:
    """work_dir/outputs/<name>, never outside it whatever the request says: the schema holds the repo
    id, the branch and the request id to their rules, and this holds the result, symlinks resolved."""
    outputs = settings.outputs_dir.resolve()
    target = outputs / name
    # Its own folder exactly: nothing in the name that normalises away ('..', '.'), no symlink on the way.
    if (
        os.path.normpath(target) != str(target)
        or target.resolve() != target
        or len(target.relative_to(outputs).parts) < 2
    ):
        raise PushFailed(
            "hub_error", f"output: {name} names no folder of its own inside the local sink {outputs}", retryable=False
        )
    return target
