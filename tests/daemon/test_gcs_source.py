"""Datasets in Google Cloud Storage, end to end through the daemon, as S3 is: Parquet by a glob
with an eval set of JSON Lines from the same store, and a streamed JSON Lines source, read with
gcsfs from a real GCS JSON API server on the loopback (gcp-storage-emulator). Each `succeeded`
records the objects' generations, ETags and sizes, and the model card names them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from tests.helpers import CHAT_ROWS, sft_request, submit, terminal_events
from tests.hub_server import HubServer
from tests.processes import DaemonProcess

BUCKET = "ml-data"


def put(endpoint: str, key: str, data: bytes) -> None:
    import gcsfs

    gcsfs.GCSFileSystem(endpoint_url=endpoint, token="anon").pipe(f"{BUCKET}/{key}", data)


def parquet(rows: list[dict[str, object]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def jsonl(rows: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_gcs_parquet_glob_eval_source_and_streaming(published: HubServer, settings: Settings, gcs_endpoint: str, tmp_path: Path) -> None:
    put(gcs_endpoint, "curated/chat/part-0.parquet", parquet(CHAT_ROWS[:3]))
    put(gcs_endpoint, "curated/chat/part-1.parquet", parquet(CHAT_ROWS[3:]))
    put(gcs_endpoint, "curated/eval.jsonl", jsonl(CHAT_ROWS[:2]))
    put(gcs_endpoint, "curated/stream.jsonl", jsonl(CHAT_ROWS))
    settings = settings.model_copy(update={
        "allowed_dataset_urls": [f"gs://{BUCKET}/curated/*"],
        "dataset_storage_options": {"gs": {"endpoint_url": gcs_endpoint, "token": "anon"}},
    })
    training = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
    requests = {
        "gcs-parquet": sft_request("gcs-parquet", dataset={"url": f"gs://{BUCKET}/curated/chat/*.parquet", "eval": {"url": f"gs://{BUCKET}/curated/eval.jsonl"}},
                                   training={**training, "eval_strategy": "steps", "eval_steps": 3}),
        "gcs-stream": sft_request("gcs-stream", dataset={"url": f"gs://{BUCKET}/curated/stream.jsonl", "streaming": True}, training=training),
    }
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    try:
        for request in requests.values():
            await submit(settings, request)
        events = await terminal_events(settings, set(requests), timeout_s=800)
    finally:
        daemon.stop()
    done = {rid: evs[-1] for rid, evs in events.items()}
    assert all(isinstance(event, Succeeded) for event in done.values()), done
    succeeded: dict[str, Succeeded] = done  # type: ignore[assignment]

    train, evaluation = succeeded["gcs-parquet"].dataset_sources
    assert (train.role, train.kind, evaluation.role, evaluation.kind) == ("train", "object_storage", "eval", "object_storage")
    assert [f.path for f in train.files] == [f"gs://{BUCKET}/curated/chat/part-0.parquet", f"gs://{BUCKET}/curated/chat/part-1.parquet"]
    assert all(f.etag and f.version_id and f.size for f in train.files + evaluation.files)  # ETag (MD5), generation, size
    assert "eval_loss" in succeeded["gcs-parquet"].metrics
    [stream] = succeeded["gcs-stream"].dataset_sources
    assert stream.kind == "object_storage" and stream.files[0].path == f"gs://{BUCKET}/curated/stream.jsonl"

    card = published.commits("results/gcs-parquet")[0].files["README.md"].decode()
    assert "## Training data" in card and train.files[0].etag in card and f"gs://{BUCKET}/curated/chat/part-0.parquet" in card
