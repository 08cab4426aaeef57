"""The operator's rules for what a request may ask of this host; a request outside them is rejected."""

from __future__ import annotations

from pathlib import Path

from daemon.settings import Settings
from schemas import FieldError
from schemas.request import RequestBase


def policy_errors(request: RequestBase, settings: Settings) -> list[FieldError]:
    errors = []
    if request.model.id.startswith("/"):
        path = Path(request.model.id).resolve()
        if not any(path.is_relative_to(root.resolve()) for root in settings.allowed_local_model_roots):
            roots = [str(root) for root in settings.allowed_local_model_roots] or "none configured"
            errors.append(FieldError(path="model.id", message=f"local path {request.model.id} is outside allowed_local_model_roots ({roots})"))
    if request.model.trust_remote_code and not settings.allow_trust_remote_code:
        errors.append(FieldError(path="model.trust_remote_code", message="refused: this host's policy does not allow remote code"))
    return errors
