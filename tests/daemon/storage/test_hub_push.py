"""The push step against the local Hub server, with the real huggingface_hub client."""

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from daemon.errors import PushFailed
from daemon.hub import push as hub_push
from daemon.hub.model_card import CardContents, model_card
from daemon.settings import Settings
from schemas import SFTRequest
from testbed.data import HUB_TOKEN
from testbed.hub_server import HubServer


def request(request_id: str, **output: object) -> SFTRequest:
    return SFTRequest.model_validate(
        {
            "request_id": request_id,
            "method": "sft",
            "model": {"id": "tiny/base"},
            "dataset": {"rows": [{"text": "x"}]},
            "output": {"repo_id": f"pushes/{request_id}", **output},
        }
    )


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 4}')
    (folder / "adapter_model.safetensors").write_bytes(b"\x00weights")
    (folder / "README.md").write_text(
        model_card(
            CardContents(
                request("card"), "trl.SFTTrainer/trl.SFTConfig", "abc123", {"train_loss": 1.5}, {"trl": "1.16.0"}
            )
        )
    )
    return folder


def hub_settings(hub: HubServer, tmp_path: Path, **overrides: object) -> Settings:
    return Settings(hub_endpoint=hub.endpoint, hub_token=HUB_TOKEN, work_dir=tmp_path, **overrides)  # type: ignore[arg-type]


def test_one_commit_records_the_request_id(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    result = hub_push.push(artifact, request("push-1"), hub_settings(hub, tmp_path))
    commits = hub.commits("pushes/push-1")
    assert len(commits) == 1
    assert result.sink == "hub" and result.commit_sha == commits[0].sha
    assert result.commit_url is not None and result.commit_url.endswith(commits[0].sha)
    assert "adapterd-request-id: push-1" in commits[0].description
    assert set(commits[0].files) >= {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    assert hub.repo("pushes/push-1").private is True


def test_model_card_metadata(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    hub_push.push(artifact, request("push-card"), hub_settings(hub, tmp_path))
    card = hub.commits("pushes/push-card")[0].files["README.md"].decode()
    front_matter = card.split("---")[1]
    assert "base_model: tiny/base" in front_matter
    assert "library_name: peft" in front_matter
    assert "- trl" in front_matter and "- sft" in front_matter
    assert "abc123" in card and "train_loss" in card


def test_branch_revision_is_created(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    result = hub_push.push(artifact, request("push-branch", revision="experiment"), hub_settings(hub, tmp_path))
    assert hub.commits("pushes/push-branch", revision="experiment")[0].sha == result.commit_sha
    assert hub.commits("pushes/push-branch", revision="main") == []


def test_transient_errors_are_retried_without_a_second_commit(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    hub.fail("POST", r"/api/models/pushes/push-retry/commit/", 500, times=1)
    hub.fail("POST", r"/api/models/pushes/push-retry/preupload/", 429, times=1, headers={"Retry-After": "0"})
    retries_before = REGISTRY.get_sample_value("adapterd_hub_push_retries_total") or 0.0
    result = hub_push.push(artifact, request("push-retry"), hub_settings(hub, tmp_path))
    assert [c.sha for c in hub.commits("pushes/push-retry")] == [result.commit_sha]
    # The 500 on the commit is adapterd's retry (huggingface_hub retries some 429s by itself).
    assert (REGISTRY.get_sample_value("adapterd_hub_push_retries_total") or 0.0) - retries_before >= 1


def test_a_hub_that_stops_answering_times_out_into_a_retry(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    hung = hub.fail("POST", r"/api/models/pushes/push-timeout/commit/", 500, times=1, delay_s=20)
    result = hub_push.push(artifact, request("push-timeout"), hub_settings(hub, tmp_path, hub_timeout_s=1))
    assert hung.answered == 0, "the push waited for the hung call instead of timing out"
    assert [c.sha for c in hub.commits("pushes/push-timeout")] == [result.commit_sha]
    commit_calls = [
        path
        for method, path in hub.requests
        if method == "POST" and path.startswith("/api/models/pushes/push-timeout/commit/")
    ]
    assert len(commit_calls) == 2  # the one that timed out, and the retry


def test_unauthorised_fails_at_once(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    hub.fail("POST", r"/api/repos/create", 401, times=5)
    with pytest.raises(PushFailed) as failure:
        hub_push.push(artifact, request("push-401"), hub_settings(hub, tmp_path))
    assert failure.value.code == "hub_unauthorized" and failure.value.retryable is False
    assert sum(1 for method, path in hub.requests if path == "/api/repos/create") >= 1
    remaining = [f for f in hub.faults if f.path_pattern == r"/api/repos/create"][0].times
    assert remaining == 4, "an authorisation error must not be retried"
    hub.faults.clear()


def test_retries_give_up_with_a_retryable_failure(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    hub.fail("POST", r"/api/models/pushes/push-503/commit/", 503, times=2)
    with pytest.raises(PushFailed) as failure:
        hub_push.push(artifact, request("push-503"), hub_settings(hub, tmp_path, hub_push_attempts=2))
    assert failure.value.code == "hub_error" and failure.value.retryable is True
    assert artifact.joinpath("adapter_model.safetensors").exists(), "the artifact stays on disk for a later push"


def test_local_sink_without_a_token(artifact: Path, tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path / "work", hub_token=None)
    result = hub_push.push(artifact, request("local-1"), settings)
    assert result.sink == "local" and result.commit_sha is None
    assert Path(result.location) == tmp_path / "work" / "outputs" / "pushes" / "local-1"
    assert (Path(result.location) / "adapter_model.safetensors").read_bytes() == b"\x00weights"


def test_the_hub_client_keeps_its_timeout_after_the_library_drops_it() -> None:
    import huggingface_hub

    hub_push.use_timeout(7.0)
    assert huggingface_hub.get_session().timeout.read == 7.0
    huggingface_hub.close_session()  # as the library does after a fork or an SSL error
    assert huggingface_hub.get_session().timeout.read == 7.0


def test_a_local_base_names_its_hub_id_or_nothing_and_the_hub_refuses_a_path(
    hub: HubServer, artifact: Path, tmp_path: Path
) -> None:
    import json

    from daemon.hub.model_card import card_base_model

    local = tmp_path / "base"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen2.5-0.5B"}))
    assert card_base_model(str(local)) == "Qwen/Qwen2.5-0.5B"
    assert card_base_model(str(local), {str(local): "org/mapped"}) == "org/mapped"
    (local / "config.json").write_text(json.dumps({"_name_or_path": "/home/someone/checkpoints/x"}))
    assert card_base_model(str(local)) is None
    on_local = SFTRequest.model_validate({**request("push-local").model_dump(), "model": {"id": str(local)}})
    card = model_card(CardContents(on_local, "trl.SFTTrainer/trl.SFTConfig"))
    assert "base_model" not in card.split("---")[1] and str(local) not in card
    # The local Hub refuses a card naming a host path, as the Hub does: such a push fails.
    (artifact / "README.md").write_text("---\nbase_model: /abs/path/on/the/host\n---\n")
    with pytest.raises((PushFailed, ValueError), match="base_model"):  # the client checks the card before committing
        hub_push.push(artifact, request("push-bad-card"), hub_settings(hub, tmp_path, hub_push_attempts=1))


def gated(request_id: str, **evaluation: object) -> SFTRequest:
    return SFTRequest.model_validate(
        {
            "request_id": request_id,
            "method": "sft",
            "model": {"id": "tiny/base"},
            "dataset": {"rows": [{"text": "x"}], "eval": {"rows": [{"text": "y"}]}},
            "output": {"repo_id": f"pushes/{request_id}"},
            "evaluation": evaluation,
        }
    )


def test_a_pull_request_holds_the_commit_main_stays_and_a_redelivery_finds_it(
    hub: HubServer, artifact: Path, tmp_path: Path
) -> None:
    settings, req = hub_settings(hub, tmp_path), gated("pr-1", on_fail="pr")
    assert hub_push.find_commit(req, settings) is None
    result = hub_push.push(artifact, req, settings, "main", create_pr=True)
    [pull] = hub.pulls("pushes/pr-1")
    assert (result.revision, result.pr_url) == ("refs/pr/1", f"{hub.endpoint}/pushes/pr-1/discussions/1")
    assert pull.title == hub_push.commit_title(req)
    assert hub.commits("pushes/pr-1") == []  # main untouched
    [commit] = hub.commits("pushes/pr-1", revision="refs/pr/1")
    assert commit.sha == result.commit_sha and "adapter_model.safetensors" in commit.files
    # A redelivered request finds that commit in its pull request (one effect per request id).
    found = hub_push.find_commit(req, settings)
    assert found is not None and (found.commit_sha, found.revision, found.pr_url) == (
        result.commit_sha,
        "refs/pr/1",
        result.pr_url,
    )
    assert (
        hub_push.find_commit(gated("pr-2", on_fail="pr"), settings) is None
    )  # another request's id finds nothing there


def test_a_side_branch_commit_is_found_again(hub: HubServer, artifact: Path, tmp_path: Path) -> None:
    settings, req = hub_settings(hub, tmp_path), gated("side-1", on_fail="branch", fail_branch="gate/failed")
    result = hub_push.push(artifact, req, settings, "gate/failed")
    assert result.revision == "gate/failed" and hub.commits("pushes/side-1") == []
    found = hub_push.find_commit(req, settings)
    assert found is not None and (found.commit_sha, found.revision, found.pr_url) == (
        result.commit_sha,
        "gate/failed",
        None,
    )


def test_the_local_sinks_pull_request_is_a_folder_of_the_requests_own_beside_main(
    artifact: Path, tmp_path: Path
) -> None:
    settings = Settings(hub_token=None, work_dir=tmp_path / "work")
    outputs = tmp_path / "work" / "outputs" / "pushes"
    first = hub_push.push(artifact, gated("pr-local", on_fail="pr"), settings, "main", create_pr=True)
    assert (first.revision, Path(first.location), first.pr_url) == (
        "pr/pr-local",
        outputs / "pr-local#pr-local",
        (outputs / "pr-local#pr-local").as_uri(),
    )
    assert "adapter_model.safetensors" in first.files and not (outputs / "pr-local").exists()  # main untouched
    # A redelivery replaces its own pull request's folder; another request opens one of its own.
    assert hub_push.push(artifact, gated("pr-local", on_fail="pr"), settings, "main", create_pr=True) == first
    other = hub_push.push(
        artifact,
        gated("pr-local", on_fail="pr").model_copy(update={"request_id": "pr-other"}),
        settings,
        "main",
        create_pr=True,
    )
    assert Path(other.location) == outputs / "pr-local#pr-other"
    assert sorted(p.name for p in outputs.iterdir()) == ["pr-local#pr-local", "pr-local#pr-other"]
