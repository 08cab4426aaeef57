"""Whose the Hub token is, asked once as the daemon starts, for its start-up line (`daemon.started`'s
`hub_user`): a token the Hub refuses is read there at once, not after a job's training.
"""

from __future__ import annotations

import asyncio

import structlog

from daemon import executors
from daemon.settings import Settings

log = structlog.get_logger()

HUB_WHOAMI_S = 10.0  # how long the start waits to learn whose the Hub token is


async def hub_user(settings: Settings) -> str | None:
    """Whose `settings.hub_token` is; None, with the reason logged, when the Hub refuses it or does not
    answer within HUB_WHOAMI_S: the daemon starts all the same (a push is retried), and the operator
    reads why at once instead of after a job's training."""
    from huggingface_hub import HfApi

    assert settings.hub_token is not None
    api = HfApi(endpoint=settings.hub_endpoint, token=settings.hub_token.get_secret_value())
    try:
        async with asyncio.timeout(HUB_WHOAMI_S):
            who = await executors.run("hub", api.whoami)
    except Exception as exc:  # a refused token (401), an unreachable Hub, a timeout: said, never fatal
        log.error(
            "hub.token_unusable",
            hub=settings.hub_endpoint,
            error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
        )
        return None
    return str(who.get("name")) if isinstance(who, dict) else None
