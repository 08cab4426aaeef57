"""Publish a trained artifact: one Hub commit (adapter, tokenizer, model card), or a local folder.

The push is a step of its own: the artifact stays on disk until it succeeds, transient Hub errors
(429 with Retry-After, 5xx, timeouts) are retried with backoff, authorisation errors fail at once,
and nothing here ever retrains. Runs in a worker thread: `huggingface_hub` is synchronous.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx2
import structlog
from huggingface_hub import HfApi, set_client_factory
from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError
from tenacity import (
    RetryCallState,
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from daemon.errors import PushFailed
from daemon.hub.local_sink import local_pull_request, local_target
from daemon.ops.metrics import HUB_RETRIES
from daemon.settings import Settings
from handlers.protocol import is_transient_failure
from schemas.request import RequestBase

log = structlog.get_logger()

REQUEST_ID_TRAILER = "adapterd-request-id"


@dataclass(frozen=True)
class PushResult:
    sink: Literal["hub", "local"]
    repo_id: str
    revision: str
    commit_sha: str | None
    commit_url: str | None
    location: str
    files: list[str]
    pr_url: str | None = (
        None  # the pull request holding it (a gate that failed into one): the Hub's, or the local sink's folder
    )


def is_transient_push_failure(exc: BaseException) -> bool:
    """Whether a push's failure is worth another try: a Hub call's that `handlers.protocol.is_transient_failure` says
    is transient, the rule the child's downloads follow too (handlers/toolkit/loading.py); anything else is not."""
    return isinstance(exc, HfHubHTTPError | httpx2.TransportError) and is_transient_failure(exc)


def _wait(state: RetryCallState) -> float:
    """Honour the Hub's Retry-After when it sends one; otherwise back off exponentially."""
    exc = state.outcome.exception() if state.outcome else None
    response = exc.response if isinstance(exc, HfHubHTTPError) else None
    retry_after = response.headers.get("Retry-After") if response is not None else None
    if retry_after and retry_after.isdigit():
        return min(float(retry_after), 120.0)
    return wait_exponential(multiplier=0.5, max=30)(state)


def _count_retry(request_id: str, state: RetryCallState) -> None:
    HUB_RETRIES.inc()
    log.warning(
        "hub.retry",
        request_id=request_id,
        attempt=state.attempt_number,
        error=repr(state.outcome.exception()) if state.outcome else None,
    )


def use_timeout(timeout_s: float) -> None:
    """Give every Hub call of this process a timeout: huggingface_hub's own client has none, and a Hub
    that stops answering would hold a push forever instead of failing it into a retry.

    Through the public `set_client_factory`: huggingface_hub builds its shared client from this
    factory on first use, and again after it drops it (after a fork, after an SSL error), so the
    timeout survives those. The library's default client differs from this one only by its request
    hook: an offline-mode guard, a request id header, a download counter and debug logging. This
    process only creates repos, commits and lists commits (every download happens in the job's
    child, a fresh interpreter that keeps the library's default client), so of that hook what
    matters here is the request id the Hub's logs are searched by, which `_request_id` adds too;
    endpoint fixes and retries live in `http_backoff`, not in the client, and are unchanged.
    """
    global _timeout_s
    if _timeout_s == timeout_s:
        return

    def client() -> httpx2.Client:
        return httpx2.Client(
            event_hooks={"request": [_request_id]}, follow_redirects=True, timeout=httpx2.Timeout(timeout_s)
        )

    set_client_factory(client)
    _timeout_s = timeout_s


def _request_id(request: httpx2.Request) -> None:
    request.headers.setdefault("X-Amzn-Trace-Id", request.headers.get("X-Request-Id") or str(uuid.uuid4()))


_timeout_s: float | None = None


def commit_title(request: RequestBase) -> str:
    """The commit's message, which is also the title of a pull request the commit opens: it names
    the request, so an earlier attempt's pull request is found by it (`find_commit`)."""
    return f"adapterd: {request.method} adapter for request {request.request_id}"


def push_to_hub(
    artifact: Path, request: RequestBase, settings: Settings, branch: str, *, create_pr: bool = False
) -> PushResult:
    """One commit to `branch`, or, with `create_pr`, a pull request against main holding it."""
    assert settings.hub_token is not None
    use_timeout(settings.hub_timeout_s)
    api = HfApi(endpoint=settings.hub_endpoint, token=settings.hub_token.get_secret_value())
    output = request.output

    @retry(
        retry=retry_if_exception(is_transient_push_failure),
        wait=_wait,
        stop=stop_after_attempt(settings.hub_push_attempts),
        reraise=True,
        before_sleep=lambda state: _count_retry(request.request_id, state),
    )
    def commit() -> PushResult:
        api.create_repo(output.repo_id, private=output.private, exist_ok=True)
        if branch != "main" and not create_pr:
            api.create_branch(output.repo_id, branch=branch, exist_ok=True)
        info = api.upload_folder(
            folder_path=artifact,
            repo_id=output.repo_id,
            revision=None if create_pr else branch,  # a pull request is opened against main
            commit_message=commit_title(request),
            commit_description=f"{REQUEST_ID_TRAILER}: {request.request_id}",
            create_pr=create_pr,
        )
        return PushResult(
            sink="hub",
            repo_id=output.repo_id,
            revision=info.pr_revision or branch,
            commit_sha=info.oid,
            commit_url=info.commit_url,
            location=str(info.repo_url),
            files=_files(artifact),
            pr_url=info.pr_url,
        )

    try:
        return commit()
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise PushFailed(
                "hub_unauthorized",
                f"output.repo_id: the Hub refused {output.repo_id} ({status}): {exc}",
                retryable=False,
            ) from exc
        raise PushFailed(
            "hub_error",
            f"output.repo_id: pushing to {output.repo_id} failed: {exc}",
            retryable=is_transient_push_failure(exc),
        ) from exc
    except httpx2.TransportError as exc:
        raise PushFailed(
            "hub_unreachable", f"the Hub at {settings.hub_endpoint} did not answer: {exc!r}", retryable=True
        ) from exc


def push_to_local(
    artifact: Path, request: RequestBase, settings: Settings, branch: str, *, create_pr: bool = False
) -> PushResult:
    """The sink for hosts without a Hub token: `local_target`, or with `create_pr` the request's
    pull request, `local_pull_request`."""
    target = local_pull_request(request, settings) if create_pr else local_target(request, settings, branch)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(artifact, staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return PushResult(
        sink="local",
        repo_id=request.output.repo_id,
        revision=f"pr/{request.request_id}" if create_pr else branch,
        commit_sha=None,
        commit_url=None,
        location=str(target),
        files=_files(target),
        pr_url=target.as_uri() if create_pr else None,
    )


def find_commit(request: RequestBase, settings: Settings) -> PushResult | None:
    """The Hub commit an earlier attempt at this request made, found by the request id its
    description records: on output.revision, on the evaluation's fail_branch, or in a pull request
    the commit opened (titled by `commit_title`). None when there is none (or no Hub). A Hub error
    here is not a reason to fail: the push itself will report it."""
    if settings.hub_token is None:
        return None
    use_timeout(settings.hub_timeout_s)
    api = HfApi(endpoint=settings.hub_endpoint, token=settings.hub_token.get_secret_value())
    output, evaluation = request.output, request.evaluation
    trailer = f"{REQUEST_ID_TRAILER}: {request.request_id}"
    url = f"{settings.hub_endpoint}/{output.repo_id}"

    def on(revision: str, pr_url: str | None = None) -> PushResult | None:
        try:
            commits = api.list_repo_commits(output.repo_id, revision=revision)
        except RevisionNotFoundError:
            return None  # a branch nothing was pushed to yet
        found = next((commit for commit in commits if trailer in commit.message.splitlines()), None)
        if found is None:
            return None
        files = sorted(api.list_repo_files(output.repo_id, revision=found.commit_id))
        return PushResult(
            sink="hub",
            repo_id=output.repo_id,
            revision=revision,
            commit_sha=found.commit_id,
            commit_url=f"{url}/commit/{found.commit_id}",
            location=url,
            files=files,
            pr_url=pr_url,
        )

    try:
        found = on(output.revision)
        if found is None and evaluation is not None and evaluation.fail_branch is not None:
            found = on(evaluation.fail_branch)
        if found is None and evaluation is not None and evaluation.on_fail == "pr":
            title = commit_title(request)
            for pull in api.get_repo_discussions(output.repo_id, discussion_type="pull_request"):
                if pull.title == title and (found := on(f"refs/pr/{pull.num}", pull.url)) is not None:
                    break
    except (HfHubHTTPError, httpx2.TransportError) as exc:
        log.info("hub.no_earlier_commit", request_id=request.request_id, repo_id=output.repo_id, error=str(exc))
        return None
    return found


def push(
    artifact: Path, request: RequestBase, settings: Settings, branch: str | None = None, *, create_pr: bool = False
) -> PushResult:
    """Publish the artifact to `branch` (output.revision when None), or into a new pull request."""
    branch = branch if branch is not None else request.output.revision
    if settings.hub_token is None:
        return push_to_local(artifact, request, settings, branch, create_pr=create_pr)
    return push_to_hub(artifact, request, settings, branch, create_pr=create_pr)


def kept_on_host(artifact: Path, request: RequestBase, settings: Settings) -> PushResult:
    """What `succeeded` says of an artifact published nowhere (a failed gate with on_fail 'none'):
    nothing committed, the artifact left in the job's folder."""
    return PushResult(
        sink="local" if settings.hub_token is None else "hub",
        repo_id=request.output.repo_id,
        revision=request.output.revision,
        commit_sha=None,
        commit_url=None,
        location=str(artifact),
        files=_files(artifact),
    )


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
