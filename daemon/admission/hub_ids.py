"""Hub ids judged by the Hub's own rules at intake: every repo id a request names (the base and
other models, the datasets, the repo it pushes to) through huggingface_hub's `validate_repo_id`,
the check the client runs before any call. A request the Hub would refuse is rejected naming its
field, rather than accepted, tried three times and failed as `internal` (issue 37). The schema's
pattern (schemas/, which depends on pydantic only) is looser: `x.git`, `a--b`, a 97-character
name pass it."""

from __future__ import annotations

from huggingface_hub.utils import HFValidationError, validate_repo_id

from schemas import FieldError
from schemas.evaluation import TaskSuite
from schemas.request import GRPORequest, RequestBase


def hub_id_errors(request: RequestBase, models: list[tuple[str, str]]) -> list[FieldError]:
    """The Hub ids of `request` the Hub would refuse; `models`: (field path, id) of every model it
    names, a local path (`/...`) among them judged elsewhere."""
    named = [(path, model_id) for path, model_id in models if not model_id.startswith("/")]
    for prefix, source in request.dataset.sources():
        if source.id is not None:
            named.append((f"{prefix}.id", source.id))
    for index, suite in enumerate(request.evaluation.suites if request.evaluation is not None else []):
        if isinstance(suite, TaskSuite) and suite.source.id is not None:  # a task suite's rows
            named.append((f"evaluation.suites.{index}.source.id", suite.source.id))
    named.append(("output.repo_id", request.output.repo_id))
    if isinstance(request, GRPORequest) and request.grpo.log_completions_hub_repo is not None:
        named.append(("grpo.log_completions_hub_repo", request.grpo.log_completions_hub_repo))
    errors = []
    for path, repo_id in named:
        try:
            validate_repo_id(repo_id)
        except HFValidationError as exc:
            errors.append(FieldError(path=path, message=f"not a Hub repo id: {exc}"))
    return errors
