"""The one admission decision: whether this host takes a valid request, and if not, the rejection
that names each field it refuses. A pure function of the request, the host's settings and its GPUs:
nothing awaited, published or kept. Intake makes its checks that read no image on the loop
(`refusal_before_images`, microseconds) and awaits the images' (`image_refusal`, their headers read)
in a worker thread, for a request they let through that has inline images (daemon/intake.py: they
must not hold the event loop); `adapterd validate -c`, the tests and the benchmarks call `refusal`
directly, so each judges a request exactly as the daemon does.
"""

from __future__ import annotations

from typing import Protocol

from daemon.admission.capabilities import unsupported_reason
from daemon.admission.gpu_kinds import HostGpus, kind_errors
from daemon.admission.images import inline_image_errors
from daemon.admission.policy import policy_errors
from daemon.settings import Settings
from daemon.settings.ray import RaySettings
from schemas import FieldError, Rejection, RequestBase


class Gpus(Protocol):
    """What admission reads of the host's slots (daemon/resources/slots.py `Slots`, a layer above this one)."""

    gpus: list[str]
    kind: HostGpus

    def most_per_job(self) -> int: ...


def refusal(request: RequestBase, settings: Settings, slots: Gpus) -> Rejection | None:
    """Why this host will not run a valid request, or None when it takes it. The first that applies:
    a method its TRL lacks, more GPUs than it has, GPUs of a kind no host of the fleet has (or, without priority
    classes, this host lacks: daemon/admission/gpu_kinds.py), anything outside the operator's policy (each broken
    rule named), inline images that do not decode or break the operator's bounds (each named by its row)."""
    return refusal_before_images(request, settings, slots) or image_refusal(request, settings)


def refusal_before_images(request: RequestBase, settings: Settings, slots: Gpus) -> Rejection | None:
    """`refusal`'s checks that read no image, in its order: microseconds whatever the request holds,
    so intake makes them on the loop and reads the images only of a request they let through."""
    unsupported = unsupported_reason(request.method)
    if unsupported:
        return Rejection("unsupported_method", [FieldError(path="method", message=unsupported)], request.request_id)
    if runs_on_ray(request, settings, slots):
        errors = policy_errors(request, settings)
        return Rejection("policy", errors, request.request_id) if errors else None
    hosts = request.resources.hosts
    if hosts > 1 and settings.ray is None:
        return Rejection(
            "resources",
            [
                FieldError(
                    path="resources.hosts",
                    message=f"asks for {hosts} hosts; a job across hosts runs on a Ray cluster, and this host has none "
                    "([ray])",
                )
            ],
            request.request_id,
        )
    if hosts > 1 or request.resources.gpus > slots.most_per_job():
        host = (
            f"this host has {len(slots.gpus)} GPU(s)"
            if slots.gpus
            else "this host has no GPU (it runs one-GPU requests on the CPU)"
        )
        if settings.ray is not None:
            host += f", and its Ray cluster takes at most {settings.ray.max_gpus} (ray.max_gpus)"
        return Rejection(
            "resources",
            [FieldError(path="resources.gpus", message=f"asks for {request.resources.gpus} GPUs; {host}")],
            request.request_id,
        )
    kinds = kind_errors(request, settings, slots.kind)
    if kinds:
        return Rejection("resources", kinds, request.request_id)
    errors = policy_errors(request, settings)
    return Rejection("policy", errors, request.request_id) if errors else None


def runs_on_ray(request: RequestBase, settings: Settings, slots: Gpus) -> bool:
    """Whether a request goes to the operator's Ray cluster: it asks more GPUs than this host has, or names several
    hosts, within what the cluster takes (`ray.max_gpus`). Its GPUs' kind is the cluster's, not this host's: not
    judged here."""
    resources = request.resources
    return settings.ray is not None and on_ray(resources.gpus, resources.hosts, slots.most_per_job(), settings.ray)


def on_ray(gpus: int, hosts: int, most_per_job: int, ray: RaySettings) -> bool:
    """`runs_on_ray` of a request of `gpus` across `hosts`, on a host whose jobs take at most `most_per_job` GPUs:
    what the fleet's dispatcher asks of a request it has read only so far (daemon/fleet/dispatcher.py)."""
    return (hosts > 1 or gpus > most_per_job) and gpus <= ray.max_gpus


def image_refusal(request: RequestBase, settings: Settings) -> Rejection | None:
    """`refusal`'s last check: the inline images' headers read, in time linear in their bytes."""
    images = inline_image_errors(request, settings.image_bounds)
    return Rejection("invalid", images, request.request_id) if images else None
