"""Version 1 of a training request, as published to `adapterd.requests`: one model per method,
told apart by `method`.

The parts are in schemas/request_base.py (what every method shares), schemas/method_requests.py
(each method's own block), schemas/rewards.py (what scores online methods); this module is where
producers and consumers import them from. Which methods exist is the method table's to say
(schemas/methods.py); `AnyRequest` lists their models, in the table's order, and
tests/schemas/test_methods.py checks the two agree.
"""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field

from .method_requests import (
    CPORequest,
    CPOSpec,
    DistillationRequest,
    DistillationSpec,
    DPORequest,
    DPOSpec,
    GKDRequest,
    GKDSpec,
    GRPORequest,
    GRPOSpec,
    KLEarlyStopSpec,
    KTORequest,
    KTOSpec,
    OnlineDPORequest,
    OnlineDPOSpec,
    ORPORequest,
    ORPOSpec,
    PPORequest,
    PPOSpec,
    ReferencedRequest,
    ReferenceModelSpec,
    RewardRequest,
    RewardSpec,
    RLOORequest,
    RLOOSpec,
    SFTRequest,
    SFTSpec,
    TeacherModelSpec,
)
from .request_base import (
    MAX_INLINE_ROWS,
    MODEL_ID_PATTERN,
    REPO_ID_PATTERN,
    DatasetSpec,
    LoraSpec,
    ModelSpec,
    OutputSpec,
    RequestBase,
    Resources,
    TrainingSpec,
)
from .rewards import (
    AccuracyReward,
    CosineScaledReward,
    ExactMatchReward,
    LengthPenaltyReward,
    OnlineRewards,
    ReasoningAccuracyReward,
    RegexReward,
    RepetitionPenaltyReward,
    RewardFunction,
    RewardModelSpec,
    SoftOverlongPunishmentReward,
    TagCountReward,
    ThinkFormatReward,
)

# Every method's request model, in the method table's order.
AnyRequest = (
    SFTRequest
    | DPORequest
    | KTORequest
    | RewardRequest
    | GRPORequest
    | RLOORequest
    | DistillationRequest
    | ORPORequest
    | CPORequest
    | GKDRequest
    | OnlineDPORequest
    | PPORequest
)

# Any request, told apart by `method`: what intake validates against and the JSON Schema describes.
TrainingRequest = Annotated[AnyRequest, Field(discriminator="method")]

# The request models by method name.
REQUEST_MODELS: dict[str, type[RequestBase]] = {
    get_args(model.model_fields["method"].annotation)[0]: model for model in get_args(AnyRequest)
}

__all__ = [
    "MAX_INLINE_ROWS",
    "MODEL_ID_PATTERN",
    "AnyRequest",
    "CPORequest",
    "CPOSpec",
    "DistillationRequest",
    "DistillationSpec",
    "GKDRequest",
    "GKDSpec",
    "OnlineDPORequest",
    "OnlineDPOSpec",
    "REPO_ID_PATTERN",
    "REQUEST_MODELS",
    "DPORequest",
    "DPOSpec",
    "DatasetSpec",
    "ExactMatchReward",
    "GRPORequest",
    "GRPOSpec",
    "KLEarlyStopSpec",
    "KTORequest",
    "KTOSpec",
    "LengthPenaltyReward",
    "LoraSpec",
    "ModelSpec",
    "ORPORequest",
    "ORPOSpec",
    "OnlineRewards",
    "OutputSpec",
    "PPORequest",
    "PPOSpec",
    "ReferenceModelSpec",
    "ReferencedRequest",
    "RLOORequest",
    "RLOOSpec",
    "RegexReward",
    "RequestBase",
    "Resources",
    "RewardFunction",
    "RewardModelSpec",
    "RewardRequest",
    "RewardSpec",
    "SFTRequest",
    "SFTSpec",
    "TeacherModelSpec",
    "ThinkFormatReward",
    "TrainingRequest",
    "TrainingSpec",
    "AccuracyReward",
    "CosineScaledReward",
    "ReasoningAccuracyReward",
    "RepetitionPenaltyReward",
    "SoftOverlongPunishmentReward",
    "TagCountReward",
]
