"""The wire contract of adapterd, version 1: requests, lifecycle events, and their JSON Schemas.

Depends on pydantic only, so that producers and consumers can import it; checking the events'
signatures (schemas/signing.py) also needs `cryptography`, imported only when a key is read.
"""

from .common import SCHEMA_VERSION, FieldError
from .control import CONTROL_ADAPTER, Cancel, Control, Hold, Pause, Release, Resume
from .decode import Rejection, decode_request
from .event_reading import parse_event, read_event
from .events import (
    TERMINAL_TYPES,
    Accepted,
    Cancelled,
    Checkpoint,
    Event,
    Failed,
    Held,
    Paused,
    Preempted,
    Progress,
    Queued,
    Rejected,
    Released,
    Retrying,
    Started,
    Succeeded,
)
from .request import REQUEST_MODELS, RequestBase, SFTRequest, TrainingRequest
from .signing import SIGNATURE_HEADER, EventKeys, UnverifiedEvent

__all__ = [
    "REQUEST_MODELS",
    "SIGNATURE_HEADER",
    "SCHEMA_VERSION",
    "TERMINAL_TYPES",
    "Accepted",
    "Cancel",
    "Cancelled",
    "CONTROL_ADAPTER",
    "Control",
    "Held",
    "Hold",
    "Pause",
    "Paused",
    "Release",
    "Released",
    "Resume",
    "Checkpoint",
    "Event",
    "EventKeys",
    "Failed",
    "FieldError",
    "Preempted",
    "Progress",
    "Queued",
    "Rejected",
    "Rejection",
    "Retrying",
    "RequestBase",
    "SFTRequest",
    "Started",
    "Succeeded",
    "TrainingRequest",
    "UnverifiedEvent",
    "decode_request",
    "parse_event",
    "read_event",
]
