from pathlib import Path

import pytest

from daemon.cli.demo.requests import PREFERENCE_ROWS
from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_adapter_trained, download, example_request, other_model, run_handler

KTO_ROWS = [
    {"prompt": row["prompt"], "completion": row[column], "label": column == "chosen"}
    for row in PREFERENCE_ROWS
    for column in ("chosen", "rejected")
]


@pytest.mark.slow
async def test_kto_on_unpaired_labelled_rows(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request("kto", "kto-e2e", dataset={"rows": KTO_ROWS})
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("kto", "trl.KTOTrainer/trl.KTOConfig")
    assert_adapter_trained(download(published.endpoint, "results/kto-e2e", done.commit_sha, tmp_path), tiny_model_dir)


@pytest.mark.slow
def test_kto_against_another_ref_model_with_precomputed_log_probs(tiny_model_dir: Path, tmp_path: Path) -> None:
    reference = other_model(tiny_model_dir, tmp_path / "reference")

    def run(name: str, **kto: object) -> float:
        request = example_request(
            "kto",
            f"kto-{name}",
            model={"id": str(tiny_model_dir)},
            dataset={"rows": KTO_ROWS},
            kto=kto,
            ref_model={"id": str(reference)},
        )
        done, sent = run_handler(request, tmp_path / name)
        assert done.trainer == "trl.KTOTrainer/trl.KTOConfig", done
        assert done.ref_model_revision is None and [m["stage"] for m in sent if m["kind"] == "stage"][-1] == "done"
        assert_adapter_trained(tmp_path / name / "artifact", tiny_model_dir)
        return done.metrics["first_loss"]

    # The reference's log-probs computed ahead, or at each step: the same loss at the first step.
    assert run("precomputed", precompute_ref_log_probs=True) == pytest.approx(run("live"), abs=1e-4)
