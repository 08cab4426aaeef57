"""Experimental: contrastive preference optimisation with `trl.experimental.cpo.CPOTrainer`.

Rows: `chosen` and `rejected` (and usually `prompt`). No reference model: CPO's preference loss
(`loss_type`: sigmoid, hinge, ipo, or SimPO's and AlphaPO's) plus a behaviour-cloning term on the
chosen answers (`cpo_alpha`). TRL's experimental API may change between releases.
"""

from __future__ import annotations

from trl.experimental.cpo import CPOConfig, CPOTrainer

from handlers.methods.experimental.reference_free import train_reference_free
from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.reporting import StatusReporter
from schemas.request import CPORequest


def train(request: CPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    return train_reference_free(CPOTrainer, CPOConfig, request, job, reporter, "cpo")
