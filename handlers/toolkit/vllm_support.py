"""vLLM generation for the online methods (grpo, rloo), asked for by `use_vllm` in the method's block:
the preflight check that this host can run it, and the TRL arguments that point server mode at the
operator's server.

vLLM is not part of adapterd's lock (each vLLM release pins one torch, none the lock's): the operator
installs it on the hosts that use it (deploy/README.md). Both of TRL's modes need it in the child, and
CUDA: `colocate` runs the engine on the job's GPUs, `server` syncs weights into the server over NCCL.
(Not named `vllm.py`: run with handlers/toolkit/ on sys.path, such a module would pass for vLLM itself.)
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import torch

from handlers.protocol import JobFailed, JobSpec
from schemas.request import RequestBase


def check_vllm(request: RequestBase, job: JobSpec, block: str) -> None:
    """Stage `preflight`, before the dataset and any model load: a request with `use_vllm` on a host
    without vLLM or without a CUDA device fails (`vllm_unavailable`), naming what is missing."""
    fields = request.set_fields(block)
    if not fields.get("use_vllm"):
        return
    missing = []
    if find_spec("vllm") is None:
        missing.append("vLLM is not installed on this host: the operator installs it (deploy/README.md, 'vLLM')")
    if not torch.cuda.is_available():
        missing.append("no CUDA device: vLLM generates on a GPU")
    if (
        fields.get("vllm_mode") == "server" and job.vllm_server_base_url is None
    ):  # intake refuses this; a spec written elsewhere may not
        missing.append("no vLLM server configured on this host (vllm_server_base_url)")
    if missing:
        raise JobFailed("vllm_unavailable", "preflight", f"{block}.use_vllm: " + "; ".join(missing))


def vllm_arguments(request: RequestBase, job: JobSpec, block: str) -> dict[str, Any]:
    """TRL arguments adapterd sets itself: in server mode, the operator's server (`vllm_server_base_url`,
    which makes TRL ignore any host and port); nothing otherwise."""
    fields = request.set_fields(block)
    if fields.get("use_vllm") and fields.get("vllm_mode") == "server":
        return {"vllm_server_base_url": job.vllm_server_base_url}
    return {}
