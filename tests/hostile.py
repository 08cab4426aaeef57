"""What a hostile or careless producer sends: each input issue 22 measured on main, as bytes, with
the field its rejection must name. The unit tests decode them in process, the end-to-end test sends
them to a running daemon, and `benchmarks.adversarial` times them.

`HOSTILE` builds every case from the SFT request given (the e2e test's points at the local Hub);
each is (name, record value, headers, the path its error names); its request id (or, where the id
itself is refused, its record's key) is `hostile-<name>`.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

Case = tuple[str, bytes, list[tuple[str, bytes]], str]

# Credentials of each kind the scan must know (made-up values of the issuers' shapes).
CREDENTIALS = {
    "aws_secret": "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "azure_account_key": (
        "AccountName=x;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    ),
    "azure_sas": "https://acct.blob.core.windows.net/c/b?sv=2020-08-04&sig=abcdEFGH1234ijklMNOP5678qrst%2B",
    "openai": "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "anthropic": "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    "slack_token": "xoxb-1234567890-abcdefghij",
    "slack_webhook": "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "github_pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "gitlab": "glpat-abcdefghij0123456789",
    "google": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "stripe": "sk_live_abcdefghijklmnop1234",
    "basic_auth": "Authorization: Basic dXNlcjpwYXNzd29yZA==",
    "url_token": "https://x.example/a?token=abcdefgh12345",
    "hf_glued": "xhf_abcdefghijklmnopqrstuvwxyz0123456789",
    "hf_base64": base64.b64encode(b"hf_abcdefghijklmnopqrstuvwxyz0123456789").decode(),
    "random_key": "Zx8Qw3Er5Ty7Ui9Op1As2Df4Gh6Jk8LzXcVbNm",
}


def _raw(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


def hostile_cases(valid: dict[str, Any], root: Path | None = None) -> list[Case]:
    """Every hostile input, built from `valid` (an SFT request). `root`: an allowed local dataset
    root holding a symlink `link` out of it, for the path escapes."""

    def variant(name: str, path: str, **changes: Any) -> Case:
        document = copy.deepcopy(valid)
        document["request_id"] = f"hostile-{name}"
        for dotted, value in changes.items():
            target = document
            parts = dotted.split("__")
            for part in parts[:-1]:
                target = target.setdefault(part, {})
            target[parts[-1]] = value
        return (name, _raw(document), [], path)

    base = copy.deepcopy(valid)
    base["request_id"] = "hostile-huge-int"
    huge = _raw(base).replace(b'"request_id"', b'"timeout_s": ' + b"9" * 5000 + b', "request_id"', 1)
    surrogate = _raw({**valid, "request_id": "hostile-surrogate-metadata", "metadata": {"team": "@@"}}).replace(
        b"@@", b"\\ud800"
    )
    revision_surrogate = _raw(
        {**valid, "request_id": "hostile-surrogate-revision", "output": {**valid["output"], "revision": "@@"}}
    ).replace(b"@@", b"\\udfff")
    files_surrogate = _raw(
        {**valid, "request_id": "hostile-surrogate-files", "dataset": {"files": {"train": "/data/@@.jsonl"}}}
    ).replace(b"@@", b"\\ud800")
    s3_surrogate = _raw(
        {**valid, "request_id": "hostile-surrogate-s3", "dataset": {"url": "s3://bucket/@@.parquet"}}
    ).replace(b"@@", b"\\ud800")
    root_text = str(root or "/data")
    cases: list[Case] = [
        ("huge-int", huge, [], "timeout_s"),
        variant(
            "regex-overflow",
            "rewards.functions.0.pattern",
            method="grpo",
            rewards={"functions": [{"name": "regex_match", "pattern": "a{4294967296}"}]},
            dataset={"rows": [{"prompt": [{"role": "user", "content": "hi"}]}] * 2},
        ),
        ("surrogate-metadata", surrogate, [], "metadata.team"),
        ("surrogate-revision", revision_surrogate, [], "output.revision"),
        ("surrogate-files", files_surrogate, [], "dataset.files.train"),
        ("surrogate-s3", s3_surrogate, [], "dataset.url"),
        variant("revision-escape", "output.revision", output__revision="../../../jobs"),
        variant("revision-absolute", "output.revision", output__revision="/var/lib/adapterd/jobs"),
        variant("revision-namespace", "output.revision", output__revision="../../other-org/model"),
        variant("chained-url", "dataset.url", dataset={"url": f"{root_text}/link::file://"}),
        variant("glob-sibling", "dataset.url", dataset={"url": f"{root_text}*/x.jsonl"}),
        variant("long-note", "metadata.note", metadata={"note": "a-" * 20000 + "x:/"}),
        variant(
            "workers",
            "training.dataloader_num_workers",
            training={**valid.get("training", {}), "dataloader_num_workers": 100000},
        ),
        variant("num-proc", "sft.dataset_num_proc", sft={"dataset_num_proc": 100000}),
        variant(
            "batch",
            "training.per_device_train_batch_size",
            training={**valid.get("training", {}), "per_device_train_batch_size": 10**9},
        ),
        variant("steps", "training.max_steps", training={**valid.get("training", {}), "max_steps": 10**18}),
        variant("timeout", "timeout_s", timeout_s=10**12),
        # Trackers the host allows but has no server or folder for: refused, not logged somewhere local.
        variant(
            "tracker-mlflow", "training.report_to", training={**valid.get("training", {}), "report_to": ["mlflow"]}
        ),
        variant(
            "tracker-tensorboard",
            "training.report_to",
            training={**valid.get("training", {}), "report_to": ["tensorboard"]},
        ),
        variant(
            "tracker-trackio", "training.report_to", training={**valid.get("training", {}), "report_to": ["trackio"]}
        ),
        # The evaluation block: a metric name that is a path and markup (it lands in the model card),
        # a gate of a thousand rules, and a side branch that climbs out of the local sink.
        variant(
            "gate-metric",
            "evaluation.gate.0.metric",
            evaluation={"gate": [{"metric": "../../etc/passwd|<b>", "at_most": 1}]},
        ),
        variant("gate-rules", "evaluation.gate", evaluation={"gate": [{"metric": "eval_loss", "at_most": 1}] * 1000}),
        variant(
            "gate-branch", "evaluation.fail_branch", evaluation={"on_fail": "branch", "fail_branch": "../../outside"}
        ),
        variant("eval-carve", "dataset.test_split_size", dataset={**valid["dataset"], "test_split_size": 1e6}),
        variant(
            "eval-tokens",
            "evaluation.suites.0.max_new_tokens",
            dataset={**valid["dataset"], "test_split_size": 0.5},
            evaluation={
                "suites": [{"kind": "rewards", "functions": [{"name": "think_format"}], "max_new_tokens": 10**9}]
            },
        ),
        # A teacher is a model like the base: no host path outside the allowed roots, no TRL field
        # round the policy, and its on-policy answers bounded by the operator.
        variant(
            "teacher-path",
            "teacher_model.id",
            method="distillation",
            teacher_model={"id": "/etc"},
            dataset={"rows": [{"prompt": "hi"}] * 2},
        ),
        variant(
            "teacher-field",
            "distillation.teacher_model_name_or_path",
            method="distillation",
            teacher_model=valid["model"],
            distillation={"teacher_model_name_or_path": "/etc"},
            dataset={"rows": [{"prompt": "hi"}] * 2},
        ),
        variant(
            "gkd-tokens",
            "gkd.max_new_tokens",
            method="gkd",
            teacher_model=valid["model"],
            gkd={"max_new_tokens": 10**9},
        ),
        # Online DPO has no evaluation: a gate it could not be judged by is refused, not ignored.
        variant(
            "online-dpo-gate",
            "evaluation",
            method="online_dpo",
            dataset={"rows": [{"prompt": "hi"}] * 2, "eval": {"rows": [{"prompt": "ho"}]}},
            rewards={"functions": [{"name": "think_format"}]},
            evaluation={"gate": [{"metric": "eval_loss", "at_most": 1}]},
        ),
        # An evaluation library's task: a name in its registry, never a task file's path, and its
        # rows from where the host's dataset policy allows, like any other rows.
        variant(
            "task-path",
            "evaluation.suites.0.task",
            evaluation={"suites": [{"kind": "task", "task": "../../etc/passwd.yaml", "source": {"rows": [{"q": 1}]}}]},
        ),
        variant(
            "task-rows",
            "evaluation.suites.0.source.url",
            evaluation={"suites": [{"kind": "task", "task": "arc_easy", "source": {"url": "/etc/passwd"}}]},
        ),
        variant(
            "task-unvetted",
            "evaluation.suites.0.task",
            evaluation={"suites": [{"kind": "task", "task": "humaneval", "source": {"rows": [{"q": 1}]}}]},
        ),
    ]
    # The record's key names these (the id itself is refused): the producer's key is the request id.
    cases += [
        (f"request-id-{name}", _raw({**valid, "request_id": rid}), [], "request_id")
        for name, rid in (("dot", "."), ("dotdot", ".."))
    ]
    cases += [
        variant(f"secret-{kind}", "metadata.note", metadata={"note": value}) for kind, value in CREDENTIALS.items()
    ]
    return cases


def forged_retry_headers() -> list[tuple[str, bytes]]:
    """Retry headers a producer should not be able to set: attempt 99 would switch retries off, a
    due time of inf would hold the partition for ever."""
    return [("adapterd-attempt", b"99"), ("adapterd-not-before", b"inf")]


def record_cases(valid: dict[str, Any], vision_rows: list[dict[str, Any]], oversize: int) -> list[Case]:
    """Issue 37's inputs, each rejected naming its field: duplicate keys, coerced types, Hub ids the
    Hub refuses, a NUL in a local path, a pattern RE2 cannot run or one PEFT would backtrack on
    (layers_pattern), revisions git refuses, an undecodable inline image and one of a format intake
    does not read (TGA), and a request too large for its copies (`oversize` bytes, named by its limit, path ''). Built
    from `valid` (an SFT request) and `vision_rows` (chat rows with images); ids are `record-<name>`."""

    def variant(name: str, path: str, base: dict[str, Any] | None = None, **changes: Any) -> Case:
        document = copy.deepcopy(base or valid)
        document["request_id"] = f"record-{name}"
        for block, value in changes.items():
            document[block] = {**document.get(block, {}), **value} if isinstance(value, dict) else value
        return (name, _raw(document), [], path)

    duplicate = _raw(
        {**valid, "request_id": "record-duplicate-key", "metadata": {"note": "hf_abcdefghijklmnopqrstuvwxyz0123456789"}}
    )
    duplicate = duplicate[:-1] + b', "metadata": {}}'
    padded = copy.deepcopy(valid)
    padded.update(request_id="record-oversize", dataset={"rows": [{"text": "a" * oversize}, {"text": "b"}]})
    not_an_image = "data:image/png;base64," + base64.b64encode(b"not an image").decode()
    tga_rows = copy.deepcopy(vision_rows)  # a format Pillow reads but intake takes not: no signature to read it by
    tga_rows[1]["images"] = [_tga_data_uri()] * len(tga_rows[1]["images"])
    vision_rows = copy.deepcopy(vision_rows)
    vision_rows[1]["images"] = [not_an_image] * len(vision_rows[1]["images"])
    return [
        ("duplicate-key", duplicate, [], "metadata"),
        variant("string-int", "training.per_device_train_batch_size", training={"per_device_train_batch_size": "8"}),
        variant("bool-int", "training.per_device_train_batch_size", training={"per_device_train_batch_size": True}),
        variant("string-bool", "output.private", output={"private": "no"}),
        variant("digits", "training.max_steps", training={"max_steps": "9" * 4300}),
        variant("repo-git", "output.repo_id", output={"repo_id": "my-org/x.git"}),
        variant("repo-dashes", "output.repo_id", output={"repo_id": "my-org/a--b"}),
        variant("repo-dots", "output.repo_id", output={"repo_id": "my-org/a..b"}),
        variant("repo-trailing", "output.repo_id", output={"repo_id": "my-org/x-"}),
        variant("repo-long", "output.repo_id", output={"repo_id": "my-org/" + "a" * 97}),
        variant("nul-path", "model.id", model={"id": "/x\u0000"}),
        variant("lookbehind", "peft.target_modules", peft={"target_modules": "(?<=a)b"}),
        variant("rank-key", "peft.rank_pattern", peft={"rank_pattern": {"(?=x)": 4}}),
        (
            "image",
            _raw({**valid, "request_id": "record-image", "dataset": {"rows": vision_rows}}),
            [],
            "dataset.rows.1.images.0",
        ),
        (
            "image-tga",
            _raw({**valid, "request_id": "record-image-tga", "dataset": {"rows": tga_rows}}),
            [],
            "dataset.rows.1.images.0",
        ),
        variant("revision-up", "model.revision", model={"revision": "../../refs/x"}),
        variant("dataset-revision", "dataset.revision", dataset={"revision": "main/../x"}),
        variant(
            "layers-pattern",
            "peft.layers_pattern",
            peft={"layers_pattern": "([a-z._0-9]+)+Z", "layers_to_transform": [0]},
        ),
        variant("optim-list", "training.optim_target_modules", training={"optim_target_modules": ["q_proj", "(?<=a)"]}),
        ("oversize", _raw(padded), [], ""),
    ]


def _tga_data_uri() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buffer, "TGA")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


class NotUtf8(str):
    """A header name that goes on the wire as bytes that are not UTF-8, as a librdkafka producer can
    send one: aiokafka's pure-Python record builder encodes a name with `.encode` (use it inside
    `python_record_builder()`)."""

    def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
        return b"\xff\xfe"


@contextlib.contextmanager
def python_record_builder() -> Iterator[None]:
    """aiokafka's producer on its pure-Python record builder (the compiled one takes only real str names)."""
    from aiokafka.producer import message_accumulator
    from aiokafka.producer import producer as producer_module
    from aiokafka.record import default_records

    with contextlib.ExitStack() as stack:
        for module in (message_accumulator, producer_module):
            stack.enter_context(
                mock.patch.object(module, "DefaultRecordBatchBuilder", default_records._DefaultRecordBatchBuilderPy)
            )
        yield
