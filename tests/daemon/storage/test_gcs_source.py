"""Datasets in Google Cloud Storage, end to end through the daemon, as S3 is: Parquet by a glob
with an eval set of JSON Lines from the same store, and a streamed JSON Lines source, read with
gcsfs from a real GCS JSON API server on the loopback (gcp-storage-emulator). Each `succeeded`
records the objects' generations, ETags and sizes, and the model card names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import all_succeed, jsonl_bytes, parquet_bytes, sft_request

BUCKET = "ml-data"


def put(endpoint: str, key: str, data: bytes) -> None:
    import gcsfs

    gcsfs.GCSFileSystem(endpoint_url=endpoint, token="anon").pipe(f"{BUCKET}/{key}", data)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_gcs_parquet_glob_eval_source_and_streaming(
    published: HubServer, settings: Settings, gcs_endpoint: str, tmp_path: Path
) -> None:
    put(gcs_endpoint, "curated/chat/part-0.parquet", parquet_bytes(CHAT_ROWS[:3]))
    put(gcs_endpoint, "curated/chat/part-1.parquet", parquet_bytes(CHAT_ROWS[3:]))
    put(gcs_endpoint, "curated/eval.jsonl", jsonl_bytes(CHAT_ROWS[:2]))
    put(gcs_endpoint, "curated/stream.jsonl", jsonl_bytes(CHAT_ROWS))
    settings = settings.model_copy(
        update={
            "allowed_dataset_urls": [f"gs://{BUCKET}/curated/*"],
            "dataset_storage_options": {"gs": {"endpoint_url": gcs_endpoint, "token": "anon"}},
        }
    )
    training = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
    requests = {
        "gcs-parquet": sft_request(
            "gcs-parquet",
            dataset={
                "url": f"gs://{BUCKET}/curated/chat/*.parquet",
                "eval": {"url": f"gs://{BUCKET}/curated/eval.jsonl"},
            },
            training={**training, "eval_strategy": "steps", "eval_steps": 3},
        ),
        "gcs-stream": sft_request(
            "gcs-stream", dataset={"url": f"gs://{BUCKET}/curated/stream.jsonl", "streaming": True}, training=training
        ),
    }
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    succeeded: dict[str, Succeeded] = await all_succeed(settings, requests, daemon)

    train, evaluation = succeeded["gcs-parquet"].dataset_sources
    assert (train.role, train.kind, evaluation.role, evaluation.kind) == (
        "train",
        "object_storage",
        "eval",
        "object_storage",
    )
    assert [f.path for f in train.files] == [
        f"gs://{BUCKET}/curated/chat/part-0.parquet",
        f"gs://{BUCKET}/curated/chat/part-1.parquet",
    ]
    assert all(
        f.etag and f.version_id and f.size for f in train.files + evaluation.files
    )  # ETag (MD5), generation, size
    assert "eval_loss" in succeeded["gcs-parquet"].metrics
    [stream] = succeeded["gcs-stream"].dataset_sources
    assert stream.kind == "object_storage" and stream.files[0].path == f"gs://{BUCKET}/curated/stream.jsonl"

    card = published.commits("results/gcs-parquet")[0].files["README.md"].decode()
    assert (
        "## Training data" in card
        and train.files[0].etag in card
        and f"gs://{BUCKET}/curated/chat/part-0.parquet" in card
    )
