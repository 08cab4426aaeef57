"""How this host's own commands (`adapterd status`, `adapterd doctor`) reach the daemon's endpoint
at `metrics_address`: plain HTTP, or HTTPS when the endpoint has the operator's certificate.

Nothing secret goes this way (`/healthz`, `/status`), and the address may be a wildcard
(0.0.0.0:9464), so the certificate's names are not checked; its chain is, against the fleet's CA
(`http_cafile`) or, without one, the endpoint's own certificate taken as the anchor.
"""

from __future__ import annotations

import ssl

from daemon.settings import Settings


def local_url(settings: Settings, path: str) -> tuple[str, ssl.SSLContext | None]:
    """The URL of `path` on this host's endpoint, and the TLS to open it with (None: plain HTTP)."""
    if settings.http_tls_certfile is None:
        return f"http://{settings.metrics_address}{path}", None
    context = ssl.create_default_context(cafile=str(settings.http_cafile or settings.http_tls_certfile))
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the endpoint's own certificate may be the anchor
    return f"https://{settings.metrics_address}{path}", context
