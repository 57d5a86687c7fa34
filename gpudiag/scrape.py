"""The one HTTP reader of gpudiag's endpoints: an agent's ``/metrics``, a Prometheus query
(``gpudiag/live/prom_client.py`` builds its request, with credentials and TLS, and reads it here).

Why one: ``gpudiag top``, the local scheduler and the Slurm controller all read agents. Each
reading with its own ``urlopen`` gave three size limits (one of them none) and three ways to
fail. Here the answer is bounded by ``contract.MAX_SCRAPE_BYTES`` and an answer over it is
refused with that reason, never cut short and then half-parsed.
"""

from __future__ import annotations

import urllib.request

from gpudiag.contract import MAX_SCRAPE_BYTES, SCRAPE_TIMEOUT_S


def fetch(url: str | urllib.request.Request, timeout: float = SCRAPE_TIMEOUT_S, limit: int = MAX_SCRAPE_BYTES,
          opener: urllib.request.OpenerDirector | None = None) -> bytes:
    """The body at ``url`` (or of a built request, through ``opener``: headers, a TLS context).
    OSError (``URLError`` and ``HTTPError`` included) when it cannot be read, ValueError when it
    is larger than ``limit`` bytes or the URL is not one urllib opens."""
    open_url = opener.open if opener is not None else urllib.request.urlopen
    with open_url(url, timeout=timeout) as r:  # the operator's URL
        body: bytes = r.read(limit + 1)
    if len(body) > limit:
        raise ValueError(f"answer larger than {limit} bytes: not read")
    return body


def fetch_text(url: str, timeout: float = SCRAPE_TIMEOUT_S) -> str:
    """``fetch`` decoded as UTF-8 (a bad byte becomes U+FFFD: an exposition is ASCII)."""
    return fetch(url, timeout).decode("utf-8", "replace")
