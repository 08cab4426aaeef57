"""Experimental: odds ratio preference optimisation with `trl.experimental.orpo.ORPOTrainer`.

Rows: `chosen` and `rejected` (and usually `prompt`). No reference model: ORPO adds the preference
term to the SFT loss. TRL's experimental API may change between releases.
"""

from __future__ import annotations

from trl.experimental.orpo import ORPOConfig, ORPOTrainer

from handlers.methods.experimental.reference_free import train_reference_free
from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.reporting import StatusReporter
from schemas.request import ORPORequest


def train(request: ORPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    return train_reference_free(ORPOTrainer, ORPOConfig, request, job, reporter, "orpo")
